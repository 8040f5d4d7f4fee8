/* lower.h -- lowering one fusion group to one kernel of the kernel IR.
 *
 * The group's iteration space is the shape of the tensors it writes; each
 * thread computes output elements (a grid-stride loop over the linear
 * index), and each value is built recursively through the group's nodes by
 * index maps (elementwise: the same index; broadcast: dims of size 1 read
 * at 0; views: relinearised; transpose/slice/pad/...: their own maps;
 * matmul, conv, pools, serial reductions: loops), with common values
 * computed once.  A reduction group whose reduction is long enough uses one
 * block per output element and a tree reduction in shared memory.
 */
#ifndef AP_LOWER_H
#define AP_LOWER_H

#include "../kir/kir.h"
#include "../partition/partition.h"

typedef struct ap_lower_options {
	unsigned max_block_threads;  /* 0 = 256; a power of two in [32, 1024] */
} ap_lower_options;

/* Lowers group `gi` of partition `p` to a kernel named `name` (a C
 * identifier).  Every GLOBAL array of the result carries in ->tensor the
 * graph tensor (of p->g) it is bound to: the group's outputs first
 * (written), then each tensor it reads, in order of first use.  CONST
 * tensors are baked in (scalars as literals, others as constant arrays).
 * Returns NULL with `err` set: AP_EUNSUPPORTED (an op or dtype this
 * lowering cannot handle, naming the node), AP_ENOMEM. */
__ap_give ap_kir_kernel *ap_lower_group(__ap_keep const ap_partition *p, int gi,
					const char *name, const ap_lower_options *opt,
					ap_error *err);

#endif

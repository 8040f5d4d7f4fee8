/* hostcheck.h -- the checker behind host kernels printed in the checking
 * mode (AP_KIR_HOST_CHECK; the ABI is common/hostcheck.h).
 *
 * What it finds, in the terms of the PTX ISA's memory consistency model
 * (section "Memory Consistency Model") and of CUDA's __syncthreads and
 * barrier.cluster:
 *   - a data race on shared memory: two accesses to one byte by different
 *     threads, at least one a write, with no barrier between them that
 *     orders both (a block barrier orders threads of one block; a cluster
 *     barrier orders every thread of the cluster; the host runs a cluster's
 *     blocks as one wide block, so ordering is tracked per block rank);
 *   - a read of shared memory that a cp.async has not delivered: a copy's
 *     destination stays pending until a cp.async.wait_group of the thread
 *     that issued it covers its group (completion is per thread, PTX ISA
 *     "cp.async.wait_group"), and is then written by that thread at that
 *     point, so other threads still need a barrier after the wait;
 *   - a write to bytes a cp.async is still delivering;
 *   - with mbarriers, bulk copies and TMA loads (cp.async.bulk[.tensor],
 *     sm_90; PTX ISA "mbarrier"): a read or write of bytes such a copy has
 *     not delivered,
 *     or delivered in a phase of its mbarrier the thread has not waited to
 *     see complete (copies land only when a wait would otherwise block: a
 *     wait that returns at once -- the wrong parity -- leaves them in
 *     flight); a deadlock, a wait whose phase nothing left can complete
 *     (arrivals or tx bytes missing: a short expect_tx); more arrivals in
 *     a phase than expected; use before mbarrier.init, a count out of
 *     range, a re-init while something pends; a wait after two or more
 *     phases completed since the thread's last (parity aliasing); a copy
 *     still in flight when the block ends.  An mbarrier orders the bulk
 *     copies that complete on it, not other threads' ordinary stores
 *     (those still need a barrier) -- but see arms below;
 *   - in a warp-specialised kernel, whose threads the kernel splits into
 *     arms (roles(): e.g. a producer warpgroup issuing TMA loads and
 *     consumer warpgroups reading the stages; common/hostcheck.h), run
 *     as coroutines on the host and synchronised only by mbarriers: a
 *     data race between arms, where no mbarrier orders the two accesses
 *     -- a consumer reading a stage before its `full` barrier's phase
 *     completed, or a producer refilling a stage (a store, or a bulk copy
 *     or TMA load checked at its issue) while some consumer arm's reads of
 *     the old contents were not released to it through the `empty`
 *     barrier it waited on (an arm that never arrived, a wait for the
 *     wrong parity that returned at once).  Each arm keeps a vector clock
 *     (Lamport 1978; Fidge 1988, Mattern 1989; the happens-before
 *     ThreadSanitizer tracks): an arrive releases the arm's clock into the
 *     barrier's phase, a wait that sees the phase complete acquires it
 *     (PTX ISA "mbarrier": arrive is a release, a successful try_wait an
 *     acquire); within an arm, threads are ordered by barriers as
 *     without arms, and the arm is one unit towards the others (an
 *     elected thread's arrive releases what its arm's threads did
 *     before it, in the host's order).  A deadlock the coroutines run
 *     into (no arm can move, no copy in flight) names the waiting arm,
 *     the barrier, its phase and what that phase still expects;
 *   - a global access outside its buffer (extents given by the runtime per
 *     launch), a shared access outside its array, and a vector, ldmatrix
 *     row or cp.async address not aligned to its size.
 * Each violation names the kernel, the block, the array and byte offset,
 * both threads and what they did.
 *
 * Blocks: the first two, the last two and every 32nd block of a launch
 * are checked (APOLLO_HOSTCHECK_ALL_BLOCKS=1: every block), since the
 * blocks of a grid share one code path but for the edge tiles; the others
 * run unchecked at nearly the plain speed.
 *
 * Counting (ap_hostcheck_count, tests/check_traffic.c): optionally, the
 * distinct global bytes each kernel parameter had read and written in a
 * launch, and the bytes of all its loads and stores; and the shared-memory
 * wavefronts its cp.async copies take against those they need
 * (ap_hostcheck_banks_of: bank conflicts, which the host cannot time).
 *
 * Shadow state: one cell per shared byte (its last writer with that
 * write's barrier and cluster-barrier counts, its last reader(s), whether
 * a cp.async or a bulk copy is delivering it, and the mbarrier phase a
 * bulk copy's landing counted in), valid for the current block only (a
 * block generation stamp, so nothing is cleared between blocks); a list of
 * pending copies per thread; the block's mbarriers (phase, arrivals and
 * tx-count still expected), its bulk copies in flight, and per thread the
 * phases of each mbarrier it has seen complete.  With arms (roles() with
 * more than one; nothing of it otherwise): which arm each thread is in,
 * one clock per arm and two per mbarrier (its current phase's, its
 * completed phases'), of arms + 16 32-bit components each, and per shared
 * byte the epoch of its writer's arm and each arm's latest read since
 * (20 bytes an arm).  The mbarriers' state is kept in every block, those
 * whose shared memory is not tracked included, since the coroutines'
 * schedule asks it (mbar_ready, deliver).  A kernel call (one worker's
 * range of blocks) owns its state; violations are gathered process-wide
 * under a lock.
 */
#ifndef AP_CLIENT_HOSTCHECK_H
#define AP_CLIENT_HOSTCHECK_H

#include <stddef.h>

#include "../common/hostcheck.h"

/* The table a checked host object's ap_check_rt must point to. */
const ap_hcheck_ops *ap_hostcheck_ops(void);

/* Starts a checked launch: the byte extent of each kernel parameter, by
 * parameter index (n of them; 0 = unknown, not checked).  Checked launches
 * are serialised (a process-wide lock, held until ap_hostcheck_end);
 * `bytes` is copied. */
void ap_hostcheck_begin(const unsigned long long *bytes, int n);

/* Ends the launch begun last: returns the number of violations it found
 * and writes the first ones, one per line, into `buf` (cap bytes,
 * NUL-terminated; may be NULL). */
unsigned ap_hostcheck_end(char *buf, size_t cap);

/* ---- counting global traffic (tests/check_traffic.c) ---------------------------------- */

/* What one checked launch moved through one kernel parameter, in bytes. */
typedef struct ap_hostcheck_traffic {
	unsigned long long read;     /* distinct bytes read (loads, cp.async sources) */
	unsigned long long written;  /* distinct bytes written */
	unsigned long long loads;    /* bytes loaded, every access counted (a byte read by
					two threads, or twice by one, counts twice) */
	unsigned long long stores;   /* bytes stored, every access counted */
} ap_hostcheck_traffic;

/* Turns the counting of global traffic on or off (off at start) for the
 * checked launches begun after the call (process-wide: call when no
 * checked launch is under way).  A counted launch keeps, per parameter of
 * known extent, one bit per byte read and one per byte written (two
 * bitmaps of extent / 8 bytes each, allocated by ap_hostcheck_begin and
 * freed by ap_hostcheck_end) and the bytes of every load and store; a
 * predicated-off cp.async reads nothing.  While counting, every block of
 * a launch sends its accesses through the checker (as
 * APOLLO_HOSTCHECK_ALL_BLOCKS=1 does; the tracking of shared memory still
 * follows that variable), so that no block goes uncounted.  Accesses
 * outside their buffer are reported as ever and not counted; so are
 * those the printer leaves unchecked (block-uniform control flow).  Off:
 * nothing is allocated or counted, and the checker runs as before. */
void ap_hostcheck_count(int on);

/* The counts of the launch in progress (begun last), for its parameters
 * 0..n-1, into out[0..n) (a parameter whose extent was 0 or beyond those
 * ap_hostcheck_begin was given: zeros).  Call after the kernel returned
 * and before ap_hostcheck_end (the launch is still held).  Returns 0, or
 * -1 when the launch is not counted (counting off when it began, or its
 * bitmaps could not be allocated: out[] is then zeroed). */
int ap_hostcheck_traffic_of(ap_hostcheck_traffic *out, int n);

/* Shared-memory bank conflicts of the counted launch in progress, of
 * one kind of access: AP_HOSTCHECK_BANKS_COPY, the cp.async copies into
 * shared memory, each warp's k-th copy of a stretch between barriers
 * taken as one instruction (a copy loop runs the same copies in every
 * thread; a predicated-off copy still writes its zeros, so it counts too);
 * AP_HOSTCHECK_BANKS_LDMATRIX, the ldmatrix rows, each warp's k-th
 * ldmatrix one instruction (a warp-collective: every lane runs it).  The
 * model (the CUDA C Programming Guide's "Shared Memory" section and
 * Nsight Compute's wavefronts): 32 banks of 4-byte words; a warp's
 * 16-byte accesses are served a quarter-warp (8 lanes; an ldmatrix's
 * 8x8 matrix) at a time, 8-byte ones a half-warp at a time, narrower ones
 * all 32 lanes at once; a part of a warp takes as many wavefronts as the
 * most distinct words any one bank holds among its lanes (lanes on one
 * word share it), where it needs at least ceil(distinct words / 32).
 * Offsets count from each shared array's start (a shift of a whole
 * instruction's addresses keeps its conflicts).  *wavefronts gets the
 * launch's wavefronts, *ideal those it needs without a conflict; both 0
 * when it made no such access.  Returns 0, or -1 when the launch is not
 * counted (see ap_hostcheck_traffic_of) or `kind` is unknown. */
#define AP_HOSTCHECK_BANKS_COPY 0
#define AP_HOSTCHECK_BANKS_LDMATRIX 1
int ap_hostcheck_banks_of(int kind, unsigned long long *wavefronts, unsigned long long *ideal);

#endif

/* pb_budget.h -- decoding untrusted protobuf bytes under a memory budget.
 *
 * protobuf-c's unpacker allocates a struct per message and an array per
 * repeated field, so a few bytes on the wire can cost a hundred in memory
 * (an empty Tensor: 2 bytes on the wire, ~100 decoded).  An ap_pb_budget
 * is a ProtobufCAllocator that counts what the unpacker asks for (plus the
 * allocator's own overhead per block) and refuses the allocation that
 * would exceed its limit: the unpacker then frees what it built and
 * returns NULL, and `exceeded` tells that apart from bytes that do not
 * decode (as `out_of_memory` tells a failing malloc).  So decoding costs at most `limit`, checked as it goes, before
 * the rest is allocated.  Messages decoded with it are freed with
 * free_unpacked(msg, NULL) as usual (the blocks are plain malloc blocks).
 * One budget per decode call; not thread-safe.
 */
#ifndef AP_PB_BUDGET_H
#define AP_PB_BUDGET_H

#include <protobuf-c/protobuf-c.h>

#include "base.h"

typedef struct ap_pb_budget {
	ProtobufCAllocator allocator;  /* pass &b.allocator to *_unpack */
	size_t limit;                  /* bytes */
	size_t used;                   /* bytes asked for so far, overhead included */
	bool exceeded;                 /* an allocation was refused for the limit */
	bool out_of_memory;            /* malloc itself failed */
} ap_pb_budget;

/* A budget of `limit` bytes. */
void ap_pb_budget_init(ap_pb_budget *b, size_t limit);

/* The budget for decoding `len` wire bytes: ratio * len + floor bytes
 * (saturating). */
size_t ap_pb_decode_limit(size_t len, unsigned ratio, size_t floor);

#endif

/* pb_budget.c -- a counting, limiting ProtobufCAllocator (see pb_budget.h). */
#include "pb_budget.h"

#include <stdint.h>
#include <stdlib.h>

/* What malloc adds to each block, roughly (glibc: a 16-byte header and
 * 16-byte alignment). */
#define BLOCK_OVERHEAD 16

static void *budget_alloc(void *data, size_t size)
{
	ap_pb_budget *b = data;
	size_t cost = size + BLOCK_OVERHEAD;

	if (cost < size || b->used + cost < b->used || b->used + cost > b->limit) {
		b->exceeded = true;
		return NULL;
	}
	void *p;

	b->used += cost;
	p = malloc(size);
	if (!p)
		b->out_of_memory = true;
	return p;
}

static void budget_free(void *data, void *p)
{
	free(p);
}

void ap_pb_budget_init(ap_pb_budget *b, size_t limit)
{
	b->allocator.alloc = budget_alloc;
	b->allocator.free = budget_free;
	b->allocator.allocator_data = b;
	b->limit = limit;
	b->used = 0;
	b->exceeded = false;
	b->out_of_memory = false;
}

size_t ap_pb_decode_limit(size_t len, unsigned ratio, size_t floor)
{
	if (ratio && len > (SIZE_MAX - floor) / ratio)
		return SIZE_MAX;
	return len * ratio + floor;
}

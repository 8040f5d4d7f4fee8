/* order.c -- the topological order the fusion layers restore after they
 * merge micro-graphs or kernels: Kahn's algorithm with a min-heap of the
 * ready nodes keyed by their position before the merge, so that an order
 * that is already topological comes back unchanged and merged nodes land
 * as early as their dependences allow.
 */
#include "fuse.h"

#include <stdlib.h>

static void heap_push(int *heap, int *hn, const int *key, int v)
{
	int i = (*hn)++;

	heap[i] = v;
	while (i > 0 && key[heap[(i - 1) / 2]] > key[heap[i]]) {
		int tmp = heap[i];

		heap[i] = heap[(i - 1) / 2];
		heap[(i - 1) / 2] = tmp;
		i = (i - 1) / 2;
	}
}

static int heap_pop(int *heap, int *hn, const int *key)
{
	int top = heap[0], i = 0;

	heap[0] = heap[--(*hn)];
	for (;;) {
		int l = 2 * i + 1, r = l + 1, s = i;

		if (l < *hn && key[heap[l]] < key[heap[s]])
			s = l;
		if (r < *hn && key[heap[r]] < key[heap[s]])
			s = r;
		if (s == i)
			break;
		{
			int tmp = heap[i];

			heap[i] = heap[s];
			heap[s] = tmp;
		}
		i = s;
	}
	return top;
}

int ap__fuse_toposort(int n, const int *off, const int *adj, const int *key, int *order)
{
	int *indeg = calloc((size_t)n + 1, sizeof(int));
	int *heap = malloc(((size_t)n + 1) * sizeof(int));
	int hn = 0, no = 0;

	if (!indeg || !heap) {
		free(indeg);
		free(heap);
		return AP_ENOMEM;
	}
	for (int u = 0; u < n; u++)
		for (int e = off[u]; e < off[u + 1]; e++)
			indeg[adj[e]]++;
	for (int u = 0; u < n; u++)
		if (!indeg[u])
			heap_push(heap, &hn, key, u);
	while (hn > 0) {
		int u = heap_pop(heap, &hn, key);

		order[no++] = u;
		for (int e = off[u]; e < off[u + 1]; e++)
			if (--indeg[adj[e]] == 0)
				heap_push(heap, &hn, key, adj[e]);
	}
	free(indeg);
	free(heap);
	return no == n ? 0 : AP_EINTERNAL;
}

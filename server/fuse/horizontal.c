/* horizontal.c -- Layer III, parallelism stitching (APOLLO section 4.3;
 * see fuse.h).
 *
 * Independent kernels -- the branches of a multi-tail op (Q/K/V
 * projections, the two expand convolutions of a SqueezeNet fire module),
 * the independent gradient reductions of a backward pass -- each launched
 * alone leave most of a large GPU idle and pay a launch each.  Layer III
 * merges them into one launch whose blocks are split by blockIdx ranges:
 *
 *   if (blockIdx.x < g0) { kernel 0 } else if (blockIdx.x < g0 + g1) {
 *   kernel 1 with blockIdx.x - g0 } ...
 *
 * Method:
 *   1. the dependence graph of the micro-graphs (a producer of a tensor ->
 *      each reader) and each micro-graph's ASAP level (longest path from
 *      a source).  Two micro-graphs of one level have no path between
 *      them, and neither do any number of them: a set of one level can be
 *      merged without a cycle;
 *   2. within a level, kernels of the same shape (one-dimensional grid and
 *      block, the same block size, no dynamic shared memory) are packed
 *      greedily, in order, while the cost model says the merged launch is
 *      faster than the parts one after another (ap_cost_time_us: one
 *      launch overhead instead of several, against a grid that may no
 *      longer fit one wave) and the merged kernel stays within the
 *      target's static shared memory, at most MAX_PARTS parts and
 *      MAX_PARAMS parameters;
 *   3. each pack of two or more becomes one kernel: the parts' bodies are
 *      cloned (server/kir/clone.c) under uniform branches on blockIdx.x,
 *      with blockIdx.x shifted by the part's first block;
 *   4. the launches are ordered topologically again, ties by the position
 *      of their first part, so nothing moves when nothing merged.
 * Linear in the micro-graphs and their edges.
 */
#include "fuse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PARTS 32
#define MAX_PARAMS 256
#define PLACEHOLDER "ap__kernel__"

void ap_fuse_launches_free(ap_fuse_launch *l, int n)
{
	for (int i = 0; l && i < n; i++) {
		free(l[i].units);
		free(l[i].block_begin);
		free(l[i].blocks);
		free(l[i].args);
		if (l[i].n > 1)
			ap_kir_kernel_free(l[i].kernel);
	}
	free(l);
}

static unsigned grid_blocks(const ap_kir_kernel *k)
{
	return k->grid[0] * k->grid[1] * k->grid[2];
}

/* Appends the parameters of kernel k of unit m to fl->args. */
static void bind_params(ap_fuse_launch *fl, const ap_mgraph *m, const ap_kir_kernel *k)
{
	for (int i = 0; i < k->n_arrays; i++) {
		const ap_kir_array *a = k->arrays[i];

		if (a->space == AP_KIR_GLOBAL && a->param >= 0 && a->param < k->n_params)
			fl->args[fl->n_args + a->param] = m->tensor_of[a->tensor];
	}
	fl->n_args += k->n_params;
}

static int launch_init(ap_fuse_launch *fl, int n, int n_params)
{
	memset(fl, 0, sizeof(*fl));
	fl->units = malloc((size_t)n * sizeof(int));
	fl->block_begin = malloc((size_t)n * sizeof(unsigned));
	fl->blocks = malloc((size_t)n * sizeof(unsigned));
	fl->args = malloc(((size_t)n_params + 1) * sizeof(int));
	if (!fl->units || !fl->block_begin || !fl->blocks || !fl->args) {
		/* the caller counts only launches that were made: free the rest */
		free(fl->units);
		free(fl->block_begin);
		free(fl->blocks);
		free(fl->args);
		memset(fl, 0, sizeof(*fl));
		return AP_ENOMEM;
	}
	fl->n = n;
	return 0;
}

/* Static shared memory of a kernel (bytes). */
static unsigned static_shared(const ap_kir_kernel *k)
{
	uint64_t b = ap_kir_shared_bytes(k);   /* with each array's alignment padding */

	/* merged kernels' arrays follow each other: each may start 16-byte aligned */
	b = (b + 15) & ~(uint64_t)15;
	return b > UINT32_MAX ? UINT32_MAX : (unsigned)b;
}

/* Can kernel k take part in a merge at all? */
static bool mergeable(const ap_kir_kernel *k)
{
	return k->grid[1] == 1 && k->grid[2] == 1 && k->block[1] == 1 && k->block[2] == 1 &&
	       k->smem_bytes == 0 && k->cluster == 1;   /* a cluster's blocks are one unit */
}

/* The merged kernel of the units pack[0..n): a uniform branch per part. */
static ap_kir_kernel *merge_kernels(ap_kir_kernel *const *kernels, const int *pack, int n,
				    unsigned *begin, ap_error *err)
{
	ap_kir_kernel *k = ap_kir_kernel_new(PLACEHOLDER);
	ap_kir_block *cur;
	unsigned total = 0;
	bool wide = false;

	if (!k) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory merging kernels");
		return NULL;
	}
	for (int i = 0; i < n; i++)
		if (kernels[pack[i]]->index_type == AP_DT_I64)
			wide = true;
	k->index_type = wide ? AP_DT_I64 : AP_DT_I32;
	k->block[0] = kernels[pack[0]]->block[0];
	for (int i = 0; i < n; i++) {
		begin[i] = total;
		total += grid_blocks(kernels[pack[i]]);
	}
	k->grid[0] = total;
	ap_kir_comment(k, &k->body, "Layer III: %d independent kernels in one launch, split by "
		       "blockIdx.x", n);
	cur = &k->body;
	for (int i = 0; i < n; i++) {
		const ap_kir_kernel *src = kernels[pack[i]];
		ap_kir_array **arrays = calloc((size_t)src->n_arrays + 1, sizeof(*arrays));
		ap_kir_expr *bx = ap_kir_index_of(k, AP_KIR_BLOCK_X);
		ap_kir_subst s;
		ap_kir_block *body = cur;
		char prefix[16];

		if (!arrays) {
			ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory merging kernels");
			return ap_kir_kernel_free(k);
		}
		memset(&s, 0, sizeof(s));
		snprintf(prefix, sizeof(prefix), "k%d_", i);
		s.prefix = prefix;
		s.arrays = arrays;
		/* blockIdx.x of the part: the merged one less its first block,
		 * in the part's index type */
		s.index[AP_KIR_BLOCK_X] = ap_kir_cast(k, src->index_type,
						      ap_kir_addi(k, bx, -(int64_t)begin[i]));
		if (src->index_type != k->index_type)
			s.index[AP_KIR_THREAD_X] = ap_kir_cast(k, src->index_type,
							       ap_kir_index_of(k, AP_KIR_THREAD_X));
		if (i + 1 < n) {
			ap_kir_stmt *st = ap_kir_if(k, cur, ap_kir_binary(k, AP_KIR_LT, bx,
									 ap_kir_idx(k, begin[i] + grid_blocks(src))));

			if (!st) {
				free(arrays);
				break;
			}
			body = &st->body;
			cur = &st->orelse;
		}
		ap_kir_comment(k, body, "part %d: blocks [%u, %u)", i, begin[i], begin[i] + grid_blocks(src));
		if (ap_kir_clone_into(k, body, src, &s) < 0) {
			free(arrays);
			ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory merging kernels");
			return ap_kir_kernel_free(k);
		}
		free(arrays);
	}
	if (ap_kir_failed(k)) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory merging kernels");
		return ap_kir_kernel_free(k);
	}
	return k;
}

/* Levels: longest path from a source in the unit dependence graph. */
static int unit_levels(const ap_partition *p, const ap_mgraph *const *units, int n, int *level,
		       int **off_out, int **adj_out)
{
	const ap_graph *pg = p->g;
	int *unit_of_tensor = malloc(((size_t)pg->n_tensors + 1) * sizeof(int));
	int *off = calloc((size_t)n + 2, sizeof(int)), *fill = calloc((size_t)n + 1, sizeof(int));
	int *adj = NULL;

	if (!unit_of_tensor || !off || !fill)
		goto nomem;
	for (int t = 0; t < pg->n_tensors; t++)
		unit_of_tensor[t] = -1;
	for (int u = 0; u < n; u++)
		for (int i = 0; i < units[u]->g->n_outputs; i++)
			unit_of_tensor[units[u]->tensor_of[units[u]->g->outputs[i]]] = u;
	for (int pass = 0; pass < 2; pass++) {
		for (int u = 0; u < n; u++)
			for (int i = 0; i < units[u]->g->n_inputs; i++) {
				int s = unit_of_tensor[units[u]->tensor_of[units[u]->g->inputs[i]]];

				if (s < 0 || s == u)
					continue;
				if (pass == 0)
					off[s + 1]++;
				else
					adj[off[s] + fill[s]++] = u;
			}
		if (pass == 0) {
			for (int u = 0; u < n; u++)
				off[u + 1] += off[u];
			adj = malloc(((size_t)off[n] + 1) * sizeof(int));
			if (!adj)
				goto nomem;
		}
	}
	/* units are in topological order: one forward sweep */
	for (int u = 0; u < n; u++)
		level[u] = 0;
	for (int u = 0; u < n; u++)
		for (int e = off[u]; e < off[u + 1]; e++)
			if (level[adj[e]] < level[u] + 1)
				level[adj[e]] = level[u] + 1;
	free(unit_of_tensor);
	free(fill);
	*off_out = off;
	*adj_out = adj;
	return 0;
nomem:
	free(unit_of_tensor);
	free(off);
	free(fill);
	free(adj);
	return AP_ENOMEM;
}

static bool excluded(const ap_mgraph *m, const bool *no_merge)
{
	for (int i = 0; i < m->n_groups; i++)
		if (no_merge[m->groups[i]])
			return true;
	return false;
}

/* The traffic of a pack: the parts side by side in one grid. */
static ap_traffic pack_traffic(const ap_traffic *tr, const int *pack, int n)
{
	ap_traffic s;

	memset(&s, 0, sizeof(s));
	for (int i = 0; i < n; i++) {
		const ap_traffic *t = &tr[pack[i]];

		s.bytes_read += t->bytes_read;
		s.bytes_written += t->bytes_written;
		s.flops += t->flops;
		s.blocks += t->blocks;
		s.threads = t->threads;
		s.shared_bytes += t->shared_bytes;
		s.uncoalesced |= t->uncoalesced;
	}
	return s;
}

static int cmp_level(const void *a, const void *b, void *lv)
{
	const int *level = lv;
	int x = *(const int *)a, y = *(const int *)b;

	if (level[x] != level[y])
		return (level[x] > level[y]) - (level[x] < level[y]);
	return (x > y) - (x < y);
}

/* Layer III's greedy pack starting at unit cand[i]: later candidates of
 * the same level, not yet launched, of the same block size, within the
 * parameter and shared-memory limits, each taken when the cost model
 * times the pack faster together than apart.  Writes pack[0..np) (pack[0]
 * = cand[i]) and returns np (1 when `enabled` is false or the unit may not
 * merge). */
static int greedy_pack(const ap_mgraph *const *units, ap_kir_kernel *const *kernels,
		       const ap_traffic *traffic, const int *cand, int nc, int i,
		       const int *level, const int *pack_of, bool enabled, const bool *no_merge,
		       const ap_target_info *t, int pack[MAX_PARTS])
{
	int u = cand[i], np = 1, params = kernels[u]->n_params;
	unsigned smem = static_shared(kernels[u]);

	pack[0] = u;
	if (!enabled || !mergeable(kernels[u]) || excluded(units[u], no_merge))
		return 1;
	for (int j = i + 1; j < nc && level[cand[j]] == level[u] && np < MAX_PARTS; j++) {
		int v = cand[j];
		ap_traffic a, b;
		double apart, together;

		if (pack_of[v] >= 0 || !mergeable(kernels[v]) || excluded(units[v], no_merge) ||
		    kernels[v]->block[0] != kernels[u]->block[0] ||
		    params + kernels[v]->n_params > MAX_PARAMS ||
		    smem + static_shared(kernels[v]) > t->shared_per_block)
			continue;
		a = pack_traffic(traffic, pack, np);
		pack[np] = v;
		b = pack_traffic(traffic, pack, np + 1);
		apart = ap_cost_time_us(&a, t) + ap_cost_time_us(&traffic[v], t);
		together = ap_cost_time_us(&b, t);
		if (together >= apart)
			continue;
		np++;
		params += kernels[v]->n_params;
		smem += static_shared(kernels[v]);
	}
	return np;
}

/* Launch `fl` of the pack's np units (launch index li, noted in pack_of):
 * the unit's own kernel when alone, else their kernels merged, block
 * ranges one after another.  0; 1 when memory is short before fl was made
 * (fl left zeroed); or the merge's error (AP_ENOMEM or err's code: fl is
 * made, to be freed with the others). */
static int pack_launch(ap_fuse_launch *fl, int li, const int *pack, int np,
		       const ap_mgraph *const *units, ap_kir_kernel *const *kernels, int *pack_of,
		       unsigned *n_merged, ap_error *err)
{
	int total_params = 0;

	for (int q = 0; q < np; q++)
		total_params += kernels[pack[q]]->n_params;
	if (launch_init(fl, np, total_params) < 0)
		return 1;
	for (int q = 0; q < np; q++) {
		fl->units[q] = pack[q];
		fl->blocks[q] = grid_blocks(kernels[pack[q]]);
		pack_of[pack[q]] = li;
		bind_params(fl, units[pack[q]], kernels[pack[q]]);
	}
	if (np == 1) {
		fl->block_begin[0] = 0;
		fl->kernel = kernels[pack[0]];
		return 0;
	}
	fl->kernel = merge_kernels(kernels, pack, np, fl->block_begin, err);
	if (!fl->kernel)
		return err && err->code ? err->code : AP_ENOMEM;
	*n_merged += (unsigned)np;
	return 0;
}

/* The nl launches in topological order of the units' dependences (off,
 * adj over n units; pack_of: each unit's launch), ties by their first
 * unit: order[0..nl).  0, AP_ENOMEM, or AP_EINTERNAL (the merged launches
 * form a cycle). */
static int launch_order(const ap_fuse_launch *out, int nl, int n, const int *pack_of,
			const int *off, const int *adj, int *order)
{
	int *loff = calloc((size_t)nl + 2, sizeof(int));
	int *key = malloc(((size_t)nl + 1) * sizeof(int));
	int *ladj = NULL, *fill = NULL, rc = AP_ENOMEM;

	if (!loff || !key)
		goto done;
	for (int pass = 0; pass < 2; pass++) {
		for (int u = 0; u < n; u++) {
			if (pack_of[u] < 0)
				continue;
			for (int e = off[u]; e < off[u + 1]; e++) {
				int a = pack_of[u], b = pack_of[adj[e]];

				if (b < 0 || a == b)
					continue;
				if (pass == 0)
					loff[a + 1]++;
				else
					ladj[loff[a] + fill[a]++] = b;
			}
		}
		if (pass == 0) {
			for (int l = 0; l < nl; l++)
				loff[l + 1] += loff[l];
			ladj = malloc(((size_t)loff[nl] + 1) * sizeof(int));
			fill = calloc((size_t)nl + 1, sizeof(int));
			if (!ladj || !fill)
				goto done;
		}
	}
	for (int l = 0; l < nl; l++) {
		key[l] = n;
		for (int q = 0; q < out[l].n; q++)
			if (out[l].units[q] < key[l])
				key[l] = out[l].units[q];
	}
	rc = ap__fuse_toposort(nl, loff, ladj, key, order);
done:
	free(loff);
	free(key);
	free(ladj);
	free(fill);
	return rc;
}

int ap_fuse_horizontal(const ap_partition *p, const ap_mgraph *const *units,
		       ap_kir_kernel *const *kernels, const ap_traffic *traffic, int n, bool enabled,
		       const bool *no_merge, const ap_target_info *t, ap_fuse_launch **launches,
		       int *n_launches, unsigned *n_merged, ap_error *err)
{
	ap_fuse_launch *out = calloc((size_t)n + 1, sizeof(*out));
	int *level = malloc(((size_t)n + 1) * sizeof(int));
	int *cand = malloc(((size_t)n + 1) * sizeof(int));
	int *pack_of = malloc(((size_t)n + 1) * sizeof(int));   /* per unit: its launch */
	int *off = NULL, *adj = NULL, *order = NULL;
	ap_fuse_launch *sorted = NULL;
	int nl = 0, nc = 0, rc = AP_ENOMEM;

	*launches = NULL;
	*n_launches = 0;
	*n_merged = 0;
	if (!out || !level || !cand || !pack_of)
		goto out;
	if (unit_levels(p, units, n, level, &off, &adj) < 0)
		goto out;
	for (int u = 0; u < n; u++) {
		pack_of[u] = -1;
		if (kernels[u])
			cand[nc++] = u;
	}
	qsort_r(cand, (size_t)nc, sizeof(int), cmp_level, level);
	for (int i = 0; i < nc;) {
		int pack[MAX_PARTS];
		int np = greedy_pack(units, kernels, traffic, cand, nc, i, level, pack_of, enabled,
				     no_merge, t, pack);

		rc = pack_launch(&out[nl], nl, pack, np, units, kernels, pack_of, n_merged, err);
		if (rc > 0)
			goto out;
		nl++;
		if (rc)
			goto fail;
		/* the next unit not yet in a launch */
		while (i < nc && pack_of[cand[i]] >= 0)
			i++;
	}
	/* launches in topological order, ties by their first unit */
	order = malloc(((size_t)nl + 1) * sizeof(int));
	sorted = malloc(((size_t)nl + 1) * sizeof(*sorted));
	if (!order || !sorted)
		goto out;
	rc = launch_order(out, nl, n, pack_of, off, adj, order);
	if (rc == AP_ENOMEM)
		goto out;
	if (rc) {
		ap_error_set(err, rc, NULL, NULL, "Layer III: the merged launches form a cycle");
		goto fail;
	}
	for (int l = 0; l < nl; l++)
		sorted[l] = out[order[l]];
	free(out);
	out = sorted;
	sorted = NULL;
	*launches = out;
	*n_launches = nl;
	out = NULL;
	rc = 0;
	goto done;
out:
	ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory merging kernels");
	rc = AP_ENOMEM;
fail:
	ap_fuse_launches_free(out, nl);
	out = NULL;
done:
	free(level);
	free(cand);
	free(pack_of);
	free(off);
	free(adj);
	free(order);
	free(sorted);
	return rc;
}

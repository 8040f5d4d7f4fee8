/* cost.c -- the cost model (see cost.h): target figures, the value
 * builder's evaluation counts, and the time of one launch.
 */
#include "cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- targets ------------------------------------------------------------------ */

/* Published figures of the usual part of each architecture (NVIDIA's data
 * sheets and the CUDA C Programming Guide's table of compute capabilities):
 * SMs, resident threads / blocks per SM, shared memory per SM, DRAM
 * bandwidth, FP32 throughput. */
static const struct arch_row {
	int arch;
	unsigned sms, threads_sm, blocks_sm, smem_sm, smem_optin;
	double gbps, gflops, tc_gflops, tf32_gflops;
	double l2_gbps, clock_ghz;   /* L2 bandwidth (about 3x DRAM on these parts); boost clock */
} arch_table[] = {
	{75, 40, 1024, 16, 64 * 1024, 64 * 1024, 320, 8100, 65000, 0, 1300, 1.59},                  /* T4 */
	{80, 108, 2048, 32, 164 * 1024, 163 * 1024, 1555, 19500, 312000, 156000, 4800, 1.41},     /* A100 40GB */
	{86, 84, 1536, 16, 100 * 1024, 99 * 1024, 936, 35600, 71000, 35600, 2800, 1.70},          /* RTX 3090 class */
	{87, 16, 1536, 16, 164 * 1024, 163 * 1024, 205, 5300, 42500, 21250, 600, 1.30},           /* Jetson Orin */
	{89, 128, 1536, 24, 100 * 1024, 99 * 1024, 1008, 82600, 165000, 82600, 5000, 2.52},       /* RTX 4090 */
	{90, 132, 2048, 32, 228 * 1024, 227 * 1024, 3350, 67000, 989000, 494000, 10000, 1.98},    /* H100 SXM */
	{100, 148, 2048, 32, 228 * 1024, 227 * 1024, 8000, 80000, 2250000, 1100000, 20000, 1.96}, /* B200 */
	{120, 170, 1536, 32, 100 * 1024, 99 * 1024, 1792, 104800, 209000, 104800, 6000, 2.41},    /* RTX 5090 */
};

static int arch_number(const char *t, const char *prefix)
{
	size_t n = strlen(prefix);
	int v = 0, d = 0;

	if (strncmp(t, prefix, n))
		return -1;
	for (t += n; *t >= '0' && *t <= '9' && d < 4; t++, d++)
		v = 10 * v + (*t - '0');
	if (d < 2 || (*t && !(*t >= 'a' && *t <= 'z' && !t[1])))
		return -1;
	return v;
}

int ap_cost_target(const char *target, ap_target_info *out)
{
	const char *t = target && *target ? target : "cpu";
	const struct arch_row *row = &arch_table[0];
	int arch;

	if (!strncmp(t, "host:", 5) && strcmp(t + 5, "cpu"))
		t += 5;   /* the emulated GPU: its figures; the printer is the host's */
	memset(out, 0, sizeof(*out));
	out->warp = 32;
	out->max_threads_per_block = 1024;
	out->regs_per_sm = 65536;
	out->shared_per_block = 48 * 1024;
	out->shared_optin_per_block = 48 * 1024;
	if (!strcmp(t, "cpu")) {
		/* blocks become loops run by the runtime's threads; numbers of a
		 * modest server core: what matters is that launches cost little
		 * and many small blocks are fine */
		out->gpu = false;
		out->sm_count = 8;
		out->max_threads_per_sm = 1024;
		out->max_blocks_per_sm = 1024;
		out->shared_per_sm = 48 * 1024;
		out->dram_gbps = 20;
		out->l2_gbps = 80;
		out->shared_gbps = 400;
		out->gflops = 50;
		/* squeezenet1_1's stem (a 3x3 stride-2 convolution of 3
		 * channels) ran 40 ms inside its max pooling's Layer I kernel
		 * and 13 + 8 ms as a GEMM kernel and a pooling one (one thread):
		 * the direct loop reaches about a third of the tiled one */
		out->direct_gflops = 15;
		out->launch_us = 2;
		return 0;
	}
	arch = arch_number(t, "sm_");
	if (arch < 0)
		arch = arch_number(t, "compute_");
	if (arch < 0)
		return AP_EUNSUPPORTED;
	for (size_t i = 0; i < sizeof(arch_table) / sizeof(arch_table[0]); i++)
		if (arch_table[i].arch <= arch)
			row = &arch_table[i];
	out->gpu = true;
	out->arch = arch;
	out->sm_count = row->sms;
	out->max_threads_per_sm = row->threads_sm;
	out->max_blocks_per_sm = row->blocks_sm;
	out->shared_per_sm = row->smem_sm;
	out->dram_gbps = row->gbps;
	out->l2_gbps = row->l2_gbps;
	out->shared_gbps = row->sms * 128.0 * row->clock_ghz;
	out->gflops = row->gflops;
	out->direct_gflops = row->gflops;
	out->shared_optin_per_block = row->smem_optin;
	/* mma.sync m16n8k16 for float16 / bfloat16 and TF32 need sm_80 */
	out->tc_gflops = arch >= 80 ? row->tc_gflops : 0;
	out->tf32_gflops = arch >= 80 ? row->tf32_gflops : 0;
	out->wgmma = arch == 90 && t[strlen(t) - 1] == 'a';
	out->launch_us = 3;
	return 0;
}

/* ---- GEMM tiles ------------------------------------------------------------------- */

static int64_t ceil_div(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

void ap_cost_gemm_default(const ap_target_info *t, int64_t batch, int64_t M, int64_t N, int64_t K,
			  size_t elem_bytes, bool tensor_cores, ap_cost_gemm_tile *out)
{
	/* candidate block tiles, largest first: (bm, bn, tm, tn) */
	static const int simt[][4] = {
		{128, 128, 8, 8}, {128, 64, 8, 4}, {64, 128, 4, 8}, {64, 64, 4, 4},
		{64, 32, 4, 2}, {32, 64, 2, 4}, {32, 32, 2, 2}, {16, 32, 1, 2}, {16, 16, 1, 1},
	};
	static const int tc[][4] = {   /* tm, tn: warps */
		{128, 128, 2, 2}, {128, 64, 2, 2}, {64, 128, 2, 2}, {64, 64, 2, 2},
		{64, 32, 2, 1}, {32, 64, 1, 2}, {32, 32, 1, 1}, {16, 32, 1, 2}, {16, 16, 1, 2},
	};
	/* the host runs a block's threads one after the other: few threads
	 * with large register tiles (the C compiler vectorises a row of TN),
	 * tall tiles for narrow products (a squeeze convolution's 16 output
	 * channels: 128 x 16 rather than 16 x 16), and blocks enough for the
	 * worker threads rather than for SMs (squeezenet1_1, one thread:
	 * 44-47 -> 41-48 ms; small_convnet_train 4.8 -> 2.7 ms) */
	static const int host[][4] = {
		{64, 64, 8, 8}, {32, 64, 4, 8}, {64, 32, 8, 4}, {128, 16, 8, 4}, {32, 32, 4, 4},
		{64, 16, 4, 4}, {16, 32, 2, 4}, {16, 16, 2, 2},
	};
	const int (*cand)[4] = tensor_cores ? tc : t->gpu ? simt : host;
	int n = (int)(tensor_cores ? sizeof(tc) / sizeof(tc[0])
		      : t->gpu   ? sizeof(simt) / sizeof(simt[0])
				 : sizeof(host) / sizeof(host[0])),
	    pick = n - 1;
	unsigned want = t->sm_count;

	for (int i = 0; i < n; i++) {
		int64_t blocks = batch * ceil_div(M, cand[i][0]) * ceil_div(N, cand[i][1]);

		/* no tile twice the problem's size in either direction */
		if (cand[i][0] >= 2 * M && cand[i][0] > 16)
			continue;
		if (cand[i][1] >= 2 * N && cand[i][1] > 16)
			continue;
		if (blocks >= want) {
			pick = i;
			break;
		}
		pick = i;   /* else the smallest that is not oversized */
	}
	out->bm = cand[pick][0];
	out->bn = cand[pick][1];
	out->tm = cand[pick][2];
	out->tn = cand[pick][3];
	if (tensor_cores)
		out->bk = elem_bytes == 4 ? 16 : 32;
	else
		out->bk = elem_bytes >= 8 ? 8 : 16;
	while (out->bk > 8 && out->bk >= 2 * K && !(tensor_cores && out->bk <= (elem_bytes == 4 ? 8 : 16)))
		out->bk /= 2;
	out->stages = !t->gpu ? 1 : t->arch >= 80 ? 3 : 2;
}

/* ---- evaluation counts ------------------------------------------------------------ */

struct ap_cost_evals_ctx {
	const ap_graph *g;
	double *E, *E2;      /* per tensor: shared part, private part */
	int *E_stamp;        /* E valid for this stamp */
	int e_stamp;
	int *mark;           /* per node: in the current set */
	int mark_stamp;
};

__ap_give ap_cost_evals_ctx *ap_cost_evals_new(const ap_graph *g)
{
	ap_cost_evals_ctx *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->g = g;
	c->E = calloc((size_t)g->n_tensors + 1, sizeof(double));
	c->E2 = calloc((size_t)g->n_tensors + 1, sizeof(double));
	c->E_stamp = calloc((size_t)g->n_tensors + 1, sizeof(int));
	c->mark = calloc((size_t)g->n_nodes + 1, sizeof(int));
	if (!c->E || !c->E2 || !c->E_stamp || !c->mark)
		return ap_cost_evals_free(c);
	return c;
}

ap_cost_evals_ctx *ap_cost_evals_free(ap_cost_evals_ctx *c)
{
	if (!c)
		return NULL;
	free(c->E);
	free(c->E2);
	free(c->E_stamp);
	free(c->mark);
	free(c);
	return NULL;
}

static double numel(const ap_graph *g, int t)
{
	int64_t n = ap_tensor_numel(&g->tensors[t]);

	return n > 0 ? (double)n : 0.0;
}

double ap_cost_reads_per_element(const ap_graph *g, const ap_node *n, int i)
{
	int x = n->inputs[i], y = n->outputs[0];
	double nx = x >= 0 ? numel(g, x) : 0, ny = y >= 0 ? numel(g, y) : 0;

	switch (n->op) {
	case AP_OP_MATMUL: {
		const ap_tensor *a = &g->tensors[n->inputs[0]];

		return a->rank > 0 ? (double)a->dims[a->rank - 1] : 1.0;
	}
	case AP_OP_CONV:
	case AP_OP_CONV_TRANSPOSE: {
		const ap_tensor *yt = &g->tensors[y];
		double per = yt->rank > 1 && yt->dims[1] > 0 ? numel(g, n->inputs[1]) / (double)yt->dims[1]
							     : 1.0;

		return i == 2 ? 1.0 : per;
	}
	case AP_OP_CONCAT:
	case AP_OP_PAD:
		return ny > 0 ? nx / ny : 0;
	default:
		break;
	}
	if (ap_op_category_of(n->op) == AP_CAT_REDUCTION)
		return ny > 0 ? nx / ny : 0;
	return 1.0;
}

static double *E_at(ap_cost_evals_ctx *c, int t)
{
	if (c->E_stamp[t] != c->e_stamp) {
		c->E_stamp[t] = c->e_stamp;
		c->E[t] = 0;
		c->E2[t] = 0;
	}
	return &c->E[t];
}

double ap_cost_eval_of(const ap_cost_evals_ctx *c, int t)
{
	return c->E_stamp[t] == c->e_stamp ? c->E[t] : 0.0;
}

/* Does node n read input i at the very index of its output element, so
 * that the value is shared with other such readers? */
static bool reads_in_place(const ap_graph *g, const ap_node *n, int i, const ap_cost_graph_view *gv)
{
	int x = n->inputs[i], y = n->outputs[0];
	ap_op_category cat = ap_op_category_of(n->op);

	if (x < 0 || y < 0 || gv->source_of(x, gv->user) != x)
		return false;
	if (cat != AP_CAT_ELEMWISE && cat != AP_CAT_BROADCAST)
		return false;
	return ap_dims_equal(g->tensors[x].rank, g->tensors[x].dims, g->tensors[y].rank,
			     g->tensors[y].dims);
}

void ap_cost_evals(ap_cost_evals_ctx *c, const int *nodes, int n, const ap_cost_graph_view *gv)
{
	const ap_graph *g = c->g;

	c->e_stamp++;
	c->mark_stamp++;
	for (int k = 0; k < n; k++)
		c->mark[nodes[k]] = c->mark_stamp;
	/* consumers before producers: a tensor's count is complete once every
	 * reader in the set has added to it */
	for (int k = n - 1; k >= 0; k--) {
		const ap_node *node = &g->nodes[nodes[k]];
		double eo = 0;

		for (int o = 0; o < node->n_outputs; o++) {
			int t = node->outputs[o];
			double *e;

			if (t < 0)
				continue;
			e = E_at(c, t);
			if (gv->written(t, gv->user) && *e < numel(g, t))
				*e = numel(g, t);
			*e += c->E2[t];
			c->E2[t] = 0;
			eo += *e;
		}
		for (int i = 0; i < node->n_inputs; i++) {
			int t = node->inputs[i], s;
			double r, *e;

			if (t < 0)
				continue;
			s = gv->source_of(t, gv->user);
			r = eo * ap_cost_reads_per_element(g, node, i);
			e = E_at(c, s);
			if (reads_in_place(g, node, i, gv)) {
				if (r > *e)
					*e = r;
			} else {
				c->E2[s] += r;
			}
		}
	}
	/* tensors made outside the set: fold the two parts */
	for (int k = 0; k < n; k++) {
		const ap_node *node = &g->nodes[nodes[k]];

		for (int i = 0; i < node->n_inputs; i++) {
			int t = node->inputs[i], s, u;

			if (t < 0)
				continue;
			s = gv->source_of(t, gv->user);
			u = g->tensors[s].producer;
			if (u >= 0 && c->mark[u] == c->mark_stamp)
				continue;
			c->E[s] += c->E2[s];
			c->E2[s] = 0;
		}
	}
}

static double touched_depth(const ap_graph *g, int t, int depth)
{
	double all = numel(g, t), sum = 0;

	/* a view's result that is written (a copy: a graph output, or a
	 * micro-graph's) takes every element it has */
	if (depth > 16 || (depth > 0 && g->tensors[t].is_output))
		return all;
	for (int i = 0; i < g->n_nodes && sum < all; i++) {
		const ap_node *n = &g->nodes[i];
		bool reads = false;

		for (int j = 0; j < n->n_inputs; j++)
			if (n->inputs[j] == t)
				reads = true;
		if (!reads)
			continue;
		if ((n->op == AP_OP_SLICE || n->op == AP_OP_GATHER) && n->inputs[0] == t &&
		    n->outputs[0] >= 0)
			sum += numel(g, n->outputs[0]);
		else if (ap_op_is_view(n->op) && n->outputs[0] >= 0)
			sum += touched_depth(g, n->outputs[0], depth + 1);
		else
			sum = all;
	}
	return sum < all ? sum : all;
}

double ap_cost_touched(const ap_graph *g, int t)
{
	return touched_depth(g, t, 0);
}

/* ---- launches ------------------------------------------------------------------ */

unsigned ap_cost_blocks_per_sm(const ap_target_info *ti, unsigned threads, unsigned shared_bytes)
{
	unsigned by_threads, by_smem, b;

	if (threads == 0 || threads > ti->max_threads_per_block)
		return 0;
	by_threads = ti->max_threads_per_sm / threads;
	by_smem = shared_bytes ? ti->shared_per_sm / shared_bytes : ti->max_blocks_per_sm;
	b = by_threads < by_smem ? by_threads : by_smem;
	if (b > ti->max_blocks_per_sm)
		b = ti->max_blocks_per_sm;
	return b;
}

/* launch_us plus `work` (microseconds on the whole machine) spread over
 * the fraction `used` of it, doubled for uncoalesced access: the end both
 * launch models share. */
static double launch_time(const ap_traffic *t, const ap_target_info *ti, double work, double used)
{
	work /= used;
	if (t->uncoalesced)
		work *= 2;
	return ti->launch_us + work;
}

unsigned ap_cost_blocks_per_sm_regs(const ap_target_info *ti, unsigned threads,
				    unsigned shared_bytes, unsigned regs)
{
	unsigned b = ap_cost_blocks_per_sm(ti, threads, shared_bytes);

	if (b && regs && ti->gpu && ti->regs_per_sm) {
		/* registers are allocated per warp, in units of 256 */
		unsigned warps = (threads + ti->warp - 1) / ti->warp;
		unsigned per_warp = (regs * ti->warp + 255) / 256 * 256;
		unsigned by_regs = ti->regs_per_sm / (per_warp * warps);

		if (by_regs < b)
			b = by_regs;
	}
	return b;
}

double ap_cost_schedule_us(const ap_traffic *t, const ap_target_info *ti)
{
	double mem_us = (t->bytes_read + t->bytes_written) / (ti->dram_gbps * 1e3);
	double l2_us = ti->l2_gbps > 0 ? t->tile_bytes / (ti->l2_gbps * 1e3) : 0;
	double sh_us = ti->shared_gbps > 0 ? t->shared_read / (ti->shared_gbps * 1e3) : 0;
	double peak = t->tensor_cores && ti->tc_gflops > 0
			      ? (t->tf32 && ti->tf32_gflops > 0 ? ti->tf32_gflops : ti->tc_gflops) : ti->gflops;
	double alu_us = t->flops / (peak * 1e3) / (t->alu_fraction > 0 ? t->alu_fraction : 1);
	unsigned threads = t->threads ? t->threads : 1, blocks = t->blocks ? t->blocks : 1;
	unsigned per_sm = ap_cost_blocks_per_sm_regs(ti, threads, t->shared_bytes, t->regs);
	double work, used = 1.0, slots, waves;

	if (per_sm == 0 || t->regs > 255 || t->unvalidated)   /* does not fit, spills, or not run on a device */
		return INFINITY;
	/* too few resident threads to keep enough loads in flight */
	if (ti->gpu) {
		double resident = (double)per_sm * threads / ti->max_threads_per_sm;

		double covered = t->inflight_bytes * per_sm * ti->sm_count / (ti->dram_gbps * 1e3);

		if (resident < 0.5 && covered < 1.0)
			mem_us *= 0.5 / resident;
	}
	work = mem_us;
	if (l2_us > work)
		work = l2_us;
	if (sh_us > work)
		work = sh_us;
	if (alu_us > work)
		work = alu_us;
	if (t->loop_fraction > 0)
		work /= t->loop_fraction;
	if (blocks < ti->sm_count)
		used = (double)blocks / ti->sm_count;
	/* a host worker thread runs one block at a time */
	slots = (double)ti->sm_count * (ti->gpu ? per_sm : 1);
	if (blocks > slots) {
		/* the tail: the last wave runs partly empty */
		waves = ceil(blocks / slots);
		used *= blocks / (waves * slots);
	}
	return launch_time(t, ti, work, used);
}

double ap_cost_time_us(const ap_traffic *t, const ap_target_info *ti)
{
	double bytes = t->bytes_read + t->bytes_written;
	double mem_us = bytes / (ti->dram_gbps * 1e3);      /* GB/s = 1e3 bytes/us */
	double peak = t->tensor_cores && ti->tc_gflops > 0 ? ti->tc_gflops : ti->gflops;
	double alu_us = t->flops / (peak * 1e3);
	double work = mem_us > alu_us ? mem_us : alu_us;
	double used = 1.0;

	/* a grid of fewer blocks than SMs uses that fraction of the machine */
	if (t->blocks && t->blocks < ti->sm_count)
		used = (double)t->blocks / ti->sm_count;
	return launch_time(t, ti, work, used);
}

bool ap_cost_staged_product_pays(const ap_target_info *t, const ap_graph *g, const ap_node *n,
				 double halo, double *k_macs)
{
	ap_op_category cat = ap_op_category_of(n->op);
	const ap_tensor *y, *w;
	double k = 1, es, split_peak, fused_us, split_us;
	bool tc;

	*k_macs = 0;
	if (n->n_inputs < 2 || n->inputs[1] < 0 || n->n_outputs < 1 || n->outputs[0] < 0)
		return false;
	y = &g->tensors[n->outputs[0]];
	w = &g->tensors[n->inputs[1]];
	if (n->op == AP_OP_CONV)
		for (int d = 1; d < w->rank; d++)
			k *= (double)w->dims[d];
	else if (cat == AP_CAT_MATMUL && w->rank >= 2)
		k = (double)w->dims[w->rank - 2];
	else
		return false;
	*k_macs = k;
	es = (double)ap_dtype_size(y->dtype);
	tc = (es == 2 && t->tc_gflops > 0) || (y->dtype == AP_DT_F32 && t->allow_tf32 && t->tf32_gflops > 0);
	split_peak = tc && t->tc_gflops > 0 ? t->tc_gflops : t->gflops;
	if (t->gflops <= 0 || t->direct_gflops <= 0 || t->dram_gbps <= 0 || halo < 1)
		return false;
	fused_us = 2 * k * halo / (t->direct_gflops * 1e3);
	split_us = 2 * k / (split_peak * 1e3) + 2 * es / (t->dram_gbps * 1e3);
	return fused_us < split_us;
}

/* check_tune.c -- the tuner (server/tune): the search over an emitter's
 * parameter space, configurations parsed back from text, tuning records in
 * the cache, and records used by builds.
 *
 *   search_finds_known_best  under a stand-in cost model whose optimum is
 *                            known (a valid GEMM tile away from the default),
 *                            the exhaustive search and simulated annealing
 *                            both find it; a model within min_gain of the
 *                            default keeps the default
 *   search_ties_keep_the_default_rule  among points the model prices alike,
 *                            the one closest to the default rule wins
 *   never_worse_than_default under the real cost model, on GEMM, row
 *                            reduction and pointwise micro-graphs for the
 *                            host, sm_80 and sm_90: best <= default
 *   sched_text               ap_sched_parse takes ap_sched_describe's text
 *                            back and refuses every malformed variant
 *   record_before_late_knob  a measured GEMM record without the `tma` knob
 *                            (written before it existed) is built with tma=0,
 *                            one missing bk is searched again
 *   records_in_the_cache     measured beats modelled, targets apart, the
 *                            generation moves only with measurements
 *   records_reused_by_builds a second graph holding the same kernel takes
 *                            its record (no search), a measured record's
 *                            configuration is the one built, an sm_80 record
 *                            is not used for sm_90
 *   signature_ignores_input_order  a kernel's signature does not depend on
 *                            the order its micro-graph lists its inputs
 *   stitched_flops_count_reductions_once  a stitched softmax's modelled
 *                            arithmetic counts its reductions once per row
 *   refined_us_reads_ptxas   ap_tune_refined_us: ptxas's own register count
 *                            gives the model's time back, more registers
 *                            (fewer resident blocks), spills and shared
 *                            memory past an SM's cost more or INFINITY
 *   background_tuner         the daemon's background tuner after a compile
 *                            that searched a GEMM for sm_90: the model's
 *                            record re-priced with ptxas (method "ptxas", its
 *                            time = ap_tune_refined_us of the chosen
 *                            configuration's kernel compiled here), every
 *                            candidate timed through the stand-in driver,
 *                            the measured record = the candidate the stand-in
 *                            times fastest, at exactly that time, the next
 *                            compile builds it, and a later job neither
 *                            compiles a refined record again nor stores a
 *                            kernel measured before
 *   budget_counts_evaluations a kernel's share of the build's budget of
 *                            evaluations, searched to exactly that many;
 *                            the wall-time safety limit counted (capped), its
 *                            cut-short search not kept as a record
 *   same_bundle_under_load   bert_like_2l compiled cold twice (fresh caches),
 *                            the second time with every core busy: the
 *                            search budget counts evaluations, so the two
 *                            bundles are byte-identical but for stats and
 *                            blobs, searched alike and never cut short
 *   same_bundle_under_load_many_kernels  ppocr_mobile_v2_cls at sm_90
 *                            (dozens of searched kernels) likewise, the
 *                            kernels' digests included; with two compile
 *                            workers under load, the same but for blobs
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dlfcn.h>

#include "proto/apollo.pb-c.h"
#include "server/backend/backend.h"
#include "server/compile/compile.h"
#include "server/lower/emitters.h"
#include "server/plan/program.h"
#include "server/tune/tune.h"
#include "server/lower/value.h"
#include "client/apollo.h"
#include "client/runtime.h"
#include "client/tool.h"
#include "tests/lib/require.h"

#define DIMS(...) ((const int64_t[]){__VA_ARGS__}), (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t))

static int tensor(ap_graph *g, const char *name, const int64_t *dims, int rank, ap_tensor_kind kind)
{
	int t = ap_graph_add_tensor(g, name, AP_DT_F32, rank, dims, kind, NULL, 0);

	ck_assert_int_ge(t, 0);
	if (kind == AP_TENSOR_INPUT || kind == AP_TENSOR_PARAM) {
		g->inputs = realloc(g->inputs, (size_t)(g->n_inputs + 1) * sizeof(int));
		g->inputs[g->n_inputs++] = t;
	}
	return t;
}

static void output(ap_graph *g, int t)
{
	g->tensors[t].is_output = true;
	g->outputs = realloc(g->outputs, (size_t)(g->n_outputs + 1) * sizeof(int));
	g->outputs[g->n_outputs++] = t;
}

static void node(ap_graph *g, const char *name, ap_op op, int n_in, const int *in, int out)
{
	ck_assert_int_ge(ap_graph_add_node(g, name, op, n_in, in, 1, &out), 0);
}

/* relu(A[M,K] x B[K,N]) (+ extra: a second, separate kernel: exp(A)). */
static ap_graph *matmul_graph(int64_t M, int64_t N, int64_t K, bool extra)
{
	ap_graph *g = ap_graph_new("mm");
	int a = tensor(g, "a", DIMS(M, K), AP_TENSOR_INPUT);
	int b = tensor(g, "b", DIMS(K, N), AP_TENSOR_INPUT);
	int y = tensor(g, "y", DIMS(M, N), AP_TENSOR_VALUE);
	int r = tensor(g, "r", DIMS(M, N), AP_TENSOR_VALUE);
	ap_error err;

	node(g, "mm", AP_OP_MATMUL, 2, (int[]){a, b}, y);
	node(g, "relu", AP_OP_RELU, 1, (int[]){y}, r);
	output(g, r);
	if (extra) {
		int e = tensor(g, "e", DIMS(M, K), AP_TENSOR_VALUE);

		node(g, "exp", AP_OP_EXP, 1, (int[]){a}, e);
		output(g, e);
	}
	ck_assert_msg(ap_graph_validate(g, &err) == 0, "validate: %s", err.msg);
	return g;
}

/* The binding of m on t to em for a test's calls (ap_bind, asserted to
 * bind): made on first use and kept in a small table (a test that binds
 * the same micro-graph on the same target again gets the same binding);
 * mgraph_free releases m's.  The key holds a copy of the target, so that
 * one variable reused for another target binds again. */
#define N_BOUND 16
static struct {
	bool used;
	ap_bound b;
	ap_target_info t;
} g_bound[N_BOUND];

static const ap_bound *B(const ap_emitter *em, const ap_mgraph *m, const ap_target_info *t)
{
	int f = -1;

	for (int i = 0; i < N_BOUND; i++) {
		if (g_bound[i].used && g_bound[i].b.em == em && g_bound[i].b.m == m &&
		    !memcmp(&g_bound[i].t, t, sizeof(*t)))
			return &g_bound[i].b;
		if (!g_bound[i].used && f < 0)
			f = i;
	}
	ck_assert_int_ge(f, 0);
	g_bound[f].t = *t;
	ck_assert_int_eq(ap_bind(em, m, &g_bound[f].t, &g_bound[f].b, NULL, 0), 1);
	g_bound[f].used = true;
	return &g_bound[f].b;
}

/* ap_mgraph_free, the test's bindings of m released first. */
static void mgraph_free(ap_mgraph *m)
{
	for (int i = 0; i < N_BOUND; i++)
		if (g_bound[i].used && g_bound[i].b.m == m) {
			ap_unbind(&g_bound[i].b);
			g_bound[i].used = false;
		}
	ap_mgraph_free(m);
}

/* The micro-graph of all of g's nodes, rooted at its first node of
 * category `root_cat` (or node 0). */
static ap_mgraph *whole(ap_graph *g, ap_group_kind kind, ap_op root_op)
{
	ap_error err;
	int nodes[16], gi = 0, root = 0;
	bool member[16];
	ap_mgraph *m;

	ck_assert_int_le(g->n_nodes, 16);
	for (int i = 0; i < g->n_nodes; i++) {
		nodes[i] = i;
		member[i] = true;
		if (g->nodes[i].op == root_op)
			root = i;
	}
	m = ap_mgraph_extract(g, nodes, member, g->n_nodes, g->outputs, g->n_outputs, kind, root, &gi,
			      1, &err);
	ck_assert_msg(m != NULL, "extract: %s", err.msg);
	return m;
}

/* As whole(g, AP_GROUP_MATMUL, AP_OP_MATMUL), views read through as the
 * partitioner leaves them (not members). */
static ap_mgraph *whole_views(ap_graph *g)
{
	ap_error err;
	int nodes[16], gi = 0, root = 0;
	bool member[16];
	ap_mgraph *m;

	ck_assert_int_le(g->n_nodes, 16);
	for (int i = 0; i < g->n_nodes; i++) {
		nodes[i] = i;
		member[i] = !ap_op_is_view(g->nodes[i].op);
		if (g->nodes[i].op == AP_OP_MATMUL)
			root = i;
	}
	m = ap_mgraph_extract(g, nodes, member, g->n_nodes, g->outputs, g->n_outputs, AP_GROUP_MATMUL,
			      root, &gi, 1, &err);
	ck_assert_msg(m != NULL, "extract: %s", err.msg);
	return m;
}

static int knob_ix(const ap_space *sp, const char *name)
{
	for (int i = 0; i < sp->n; i++)
		if (!strcmp(sp->knobs[i].name, name))
			return i;
	ck_abort_msg("no knob %s", name);
	return -1;
}

/* ---- search ------------------------------------------------------------------------- */

/* Stand-in cost: distance (in powers of two) from a target configuration,
 * plus 10; invalid points INFINITY as the real model gives them. */
static ap_sched g_want;

static double standin_cost(const ap_bound *b, const ap_sched *s, void *user)
{
	double d = 10;
	int rc = ap_sched_valid(b, s);

	(void)user;
	if (rc <= 0)
		return rc < 0 ? rc : INFINITY;
	for (int i = 0; i < s->n; i++)
		d += fabs(log2(1.0 + s->v[i]) - log2(1.0 + g_want.v[i]));   /* lib is 0 or 1 */
	return d;
}

/* Ties: every valid point but the default costs the same, the default
 * more -- the search leaves it, for a point that differs from it in one
 * knob only (the closest to the default rule among equals), exhaustive and
 * annealing alike. */
static double tie_cost(const ap_bound *b, const ap_sched *s, void *user)
{
	int rc = ap_sched_valid(b, s);

	if (rc <= 0)
		return rc < 0 ? rc : INFINITY;
	return memcmp(s->v, ((const ap_sched *)user)->v, sizeof(s->v)) ? 10 : 20;
}

START_TEST(search_ties_keep_the_default_rule)
{
	ap_graph *g = matmul_graph(256, 256, 256, false);
	ap_mgraph *m = whole(g, AP_GROUP_MATMUL, AP_OP_MATMUL);
	ap_target_info t;
	ap_space sp;
	ap_sched dflt;
	ap_tune_result r;
	ap_tune_options o = {0};
	ap_error err;

	ck_assert_int_eq(ap_cost_target("sm_90", &t), 0);
	ck_assert_int_eq(ap_emitter_default(B(&ap_emitter_gemm, m, &t), &sp, &dflt, &err), 0);
	o.cost = tie_cost;
	o.user = &dflt;
	for (int pass = 0; pass < 2; pass++) {
		int differ = 0;

		o.exhaustive_max = pass ? 1 : 100000;
		o.max_points = pass ? 300 : 100000;
		ck_assert_int_eq(ap_tune_search(B(&ap_emitter_gemm, m, &t), &o, &r, &err), 0);
		for (int i = 0; i < sp.n; i++)
			differ += r.best.v[i] != dflt.v[i];
		ck_assert_msg(differ == 1, "%s: the tie went to a point %d knobs from the default", r.method, differ);
		ck_assert(fabs(r.best_us - 10) < 1e-9);
	}
	mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

START_TEST(search_finds_known_best)
{
	ap_graph *g = matmul_graph(256, 256, 256, false);
	ap_mgraph *m = whole(g, AP_GROUP_MATMUL, AP_OP_MATMUL);
	ap_target_info t;
	ap_space sp;
	ap_sched dflt;
	ap_tune_result r;
	ap_tune_options o = {0};
	ap_error err;

	ck_assert_int_eq(ap_cost_target("sm_90", &t), 0);
	ck_assert_int_eq(ap_emitter_default(B(&ap_emitter_gemm, m, &t), &sp, &dflt, &err), 0);
	/* the target: a valid tile that is not the default */
	g_want = dflt;
	g_want.v[knob_ix(&sp, "bm")] = 64;
	g_want.v[knob_ix(&sp, "bn")] = 32;
	g_want.v[knob_ix(&sp, "bk")] = 32;
	g_want.v[knob_ix(&sp, "tm")] = 4;
	g_want.v[knob_ix(&sp, "tn")] = 2;
	g_want.v[knob_ix(&sp, "stages")] = 2;
	ck_assert_int_eq(ap_sched_valid(B(&ap_emitter_gemm, m, &t), &g_want), 1);
	ck_assert(memcmp(g_want.v, dflt.v, sizeof(dflt.v)) != 0);
	o.cost = standin_cost;

	/* exhaustive: the space enumerated */
	o.exhaustive_max = 100000;
	o.max_points = 100000;
	ck_assert_int_eq(ap_tune_search(B(&ap_emitter_gemm, m, &t), &o, &r, &err), 0);
	ck_assert_str_eq(r.method, "exhaustive");
	ck_assert_int_eq(memcmp(r.best.v, g_want.v, sizeof(g_want.v)), 0);
	ck_assert(fabs(r.best_us - 10) < 1e-9);
	ck_assert_uint_eq(r.tried, (unsigned)r.space);
	ck_assert(r.default_us > r.best_us);
	/* the candidates: best first, the default among them */
	ck_assert_int_ge(r.n_top, 2);
	ck_assert_int_eq(memcmp(r.top[0].v, g_want.v, sizeof(g_want.v)), 0);
	{
		bool has_default = false;

		for (int i = 0; i < r.n_top; i++) {
			has_default |= !memcmp(r.top[i].v, dflt.v, sizeof(dflt.v));
			if (i)
				ck_assert(r.top_us[i] >= r.top_us[i - 1] || !memcmp(r.top[i].v, dflt.v, sizeof(dflt.v)));
		}
		ck_assert(has_default);
	}

	/* simulated annealing: a bounded walk finds it too */
	o.exhaustive_max = 1;
	o.max_points = 600;
	o.seed = 12345;
	ck_assert_int_eq(ap_tune_search(B(&ap_emitter_gemm, m, &t), &o, &r, &err), 0);
	ck_assert_str_eq(r.method, "annealing");
	ck_assert_uint_le(r.tried, 600);
	ck_assert_uint_lt(r.tried, (unsigned)r.space);
	ck_assert_int_eq(memcmp(r.best.v, g_want.v, sizeof(g_want.v)), 0);

	/* the default stays unless a point is min_gain better */
	g_want = dflt;
	o.exhaustive_max = 100000;
	o.max_points = 100000;
	ck_assert_int_eq(ap_tune_search(B(&ap_emitter_gemm, m, &t), &o, &r, &err), 0);
	ck_assert_int_eq(memcmp(r.best.v, dflt.v, sizeof(dflt.v)), 0);
	mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* The GEMM's new forms (tma=1 TMA's phase form, tma=2 TMA warp
 * specialised, tma=3 warp specialised with a copying producer; none yet
 * run on a device): for a float16 4096^3 product on sm_90a the knob
 * exists; without the request's option the default rule and the search
 * keep tma=0 -- the tma=1, 2 and 3 twins of the default's kernel are
 * valid but unpriced (INFINITY) -- while with it the space holds tma=2, 1
 * and 3 and no split-K, the default and the search take 2, and the
 * tuning signature differs (records of one never serve the other). */
START_TEST(tma_only_when_asked)
{
	ap_graph *g = matmul_graph(4096, 4096, 4096, false);
	ap_mgraph *m;
	uint8_t sig[2][32];

	for (int i = 0; i < g->n_tensors; i++)
		g->tensors[i].dtype = AP_DT_F16;
	m = whole(g, AP_GROUP_MATMUL, AP_OP_MATMUL);
	for (int asked = 0; asked < 2; asked++) {
		ap_target_info t;
		ap_space sp;
		ap_sched dflt, twin;
		ap_tune_result r;
		ap_error err;
		ap_plan pl;
		ap_traffic tr;
		int tx;

		ck_assert_int_eq(ap_cost_target("sm_90a", &t), 0);
		t.tma = asked;
		ck_assert_int_eq(ap_emitter_default(B(&ap_emitter_gemm, m, &t), &sp, &dflt, &err), 0);
		tx = knob_ix(&sp, "tma");
		ck_assert_int_ge(tx, 0);
		/* asked: the warp-specialised TMA form first, then the phase
		 * form, then the copying producer; else the cp.async form first
		 * of the four */
		ck_assert_int_eq(sp.knobs[tx].n, asked ? 3 : 4);
		for (int i = 0; i < sp.knobs[tx].n; i++) {
			static const int newest[] = {2, 1, 3};

			ck_assert_int_eq(sp.knobs[tx].values[i], asked ? newest[i] : i);
		}
		ck_assert_int_eq(dflt.v[tx], asked ? 2 : 0);
		ck_assert_int_eq(sp.knobs[knob_ix(&sp, "splitk")].n, asked ? 1 : sp.knobs[knob_ix(&sp, "splitk")].n);
		ck_assert_int_eq(ap_tune_search(B(&ap_emitter_gemm, m, &t), NULL, &r, &err), 0);
		ck_assert_int_eq(r.best.v[tx], asked ? 2 : 0);
		for (int form = 1; !asked && form <= 3; form++) {
			twin = dflt;
			twin.v[tx] = form;
			twin.v[knob_ix(&sp, "lib")] = 0;   /* the kernel, not cuBLASLt's call */
			ck_assert_int_eq(ap_sched_valid(B(&ap_emitter_gemm, m, &t), &twin), 1);
			ck_assert_int_eq(ap_emitter_gemm.resolve(B(&ap_emitter_gemm, m, &t), &twin, &pl), 1);
			ck_assert_int_eq(ap_emitter_gemm.traffic(B(&ap_emitter_gemm, m, &t), &pl, &tr), 0);
			ck_assert(tr.unvalidated);
			ck_assert(isinf(ap_cost_schedule_us(&tr, &t)));
		}
		printf("check_tune: 4096^3 float16 on sm_90a, TMA %s: search chose tma=%d (%.1f us modelled)\n",
		       asked ? "asked for" : "not asked for", r.best.v[tx], r.best_us);
		ck_assert_int_eq(ap_tune_signature(&ap_emitter_gemm, m, "sm_90a", &t, 0, sig[asked]), 0);
	}
	ck_assert_int_ne(memcmp(sig[0], sig[1], 32), 0);
	mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* The warp-specialised GEMM's large tile (gemm.c gm_choose): asked for the
 * new forms on sm_90a, 2048^3 to 8192^3 float16 take 128 x 256 (two
 * consumer warpgroups of m64n256, 128 accumulators a thread: 160
 * registers modelled, not a spill; four stages, the most the shared
 * memory holds, three of 384 x 64 elements in flight) -- a third less L2 traffic than 128 x 128, modelled faster than
 * cuBLASLt's call, so the kernel, lib=0 -- while 1024^3, whose 32 tiles of
 * 128 x 256 would leave most SMs idle, keeps 128 x 128 or less; not
 * asked, the tile stays 128 x 128. */
START_TEST(wgmma_large_tile)
{
	static const struct {
		int64_t n;
		bool asked;
		int bn, lib;
	} cs[] = { {4096, true, 256, 0}, {8192, true, 256, 0}, {2048, true, 256, 0}, {1024, true, 128, -1},
		   {4096, false, 128, -1} };

	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		ap_graph *g = matmul_graph(cs[i].n, cs[i].n, cs[i].n, false);
		ap_mgraph *m;
		ap_target_info t;
		ap_space sp;
		ap_sched dflt;
		ap_tune_result r;
		ap_traffic tr;
		ap_error err;
		const ap_bound *b;

		for (int k = 0; k < g->n_tensors; k++)
			g->tensors[k].dtype = AP_DT_F16;
		m = whole(g, AP_GROUP_MATMUL, AP_OP_MATMUL);
		ck_assert_int_eq(ap_cost_target("sm_90a", &t), 0);
		t.tma = t.unvalidated = cs[i].asked;
		b = B(&ap_emitter_gemm, m, &t);
		ck_assert_int_eq(ap_emitter_default(b, &sp, &dflt, &err), 0);
		ck_assert_int_eq(ap_tune_search(b, NULL, &r, &err), 0);
		printf("check_tune: %lld^3 float16 on sm_90a%s: bm=%d bn=%d tma=%d lib=%d (%.1f us modelled)\n",
		       (long long)cs[i].n, cs[i].asked ? " (--unvalidated)" : "", r.best.v[knob_ix(&sp, "bm")],
		       r.best.v[knob_ix(&sp, "bn")], r.best.v[knob_ix(&sp, "tma")], r.best.v[knob_ix(&sp, "lib")],
		       r.best_us);
		ck_assert_int_eq(dflt.v[knob_ix(&sp, "bm")], 128);
		ck_assert_int_eq(dflt.v[knob_ix(&sp, "bn")], cs[i].bn);
		ck_assert_int_eq(r.best.v[knob_ix(&sp, "bm")], 128);
		ck_assert_int_le(r.best.v[knob_ix(&sp, "bn")], cs[i].bn);
		ck_assert_int_ge(r.best.v[knob_ix(&sp, "bn")], cs[i].bn / 2);
		if (cs[i].asked) {
			ck_assert_int_eq(r.best.v[knob_ix(&sp, "tma")], 2);
			/* the TMA forms' default: the most stages that fit */
			ck_assert_int_eq(dflt.v[knob_ix(&sp, "stages")], cs[i].bn == 256 ? 4 : 5);
		}
		if (cs[i].lib >= 0)
			ck_assert_int_eq(r.best.v[knob_ix(&sp, "lib")], cs[i].lib);
		if (cs[i].bn == 256) {
			ap_sched own = r.best;

			own.v[knob_ix(&sp, "lib")] = 0;
			ck_assert_int_eq(ap_traffic_of(b, &own, &tr), 0);
			ck_assert_uint_eq(tr.regs, 160);   /* 128 accumulators and 32 more */
			/* four stages of 48 KiB (the persistent block's shared
			 * memory): three K tiles in flight ahead of the one in use */
			ck_assert_int_eq(own.v[knob_ix(&sp, "stages")], 4);
			ck_assert_double_eq(tr.inflight_bytes, 3.0 * (128 + 256) * 64 * 2);
			ck_assert(isfinite(ap_cost_schedule_us(&tr, &t)));
		}
		mgraph_free(m);
		ap_graph_free(g);
	}
}
END_TEST

/* A measured record written before the GEMM's space had `lib` and `tma`
 * (late knobs: lower.h) is still the kernel's schedule, with lib=0 and
 * tma=0 -- Apollo's cp.async kernel it was measured in -- and not searched
 * again; one missing
 * a knob that is not late (bk) is another space's and searched again. */
static ap_tune_record g_old_record;

static int lookup_old_record(void *user, const uint8_t sig[32], ap_tune_record *rec)
{
	(void)user;
	(void)sig;
	*rec = g_old_record;
	return 1;
}

START_TEST(record_before_late_knob)
{
	ap_graph *g = matmul_graph(4096, 4096, 4096, false);
	ap_tune_hooks h = {.target = "sm_90a", .budget_evals = 100, .lookup = lookup_old_record};
	ap_target_info t;
	ap_space sp;
	ap_sched dflt, s;
	ap_tune_outcome out;
	ap_error err;
	ap_mgraph *m;
	int tx, lx, bk;

	for (int i = 0; i < g->n_tensors; i++)
		g->tensors[i].dtype = AP_DT_F16;
	m = whole(g, AP_GROUP_MATMUL, AP_OP_MATMUL);
	ck_assert_int_eq(ap_cost_target("sm_90a", &t), 0);
	ck_assert_int_eq(ap_emitter_default(B(&ap_emitter_gemm, m, &t), &sp, &dflt, &err), 0);
	tx = knob_ix(&sp, "tma");
	lx = knob_ix(&sp, "lib");
	bk = knob_ix(&sp, "bk");
	ck_assert(tx >= 0 && lx >= 0 && bk >= 0 && sp.knobs[tx].late && sp.knobs[lx].late && !sp.knobs[bk].late);
	/* the record: the default's knobs but tma and lib, one of them moved to a
	 * value the default rule did not take (so that the record is seen to
	 * be used) */
	memset(&g_old_record, 0, sizeof(g_old_record));
	snprintf(g_old_record.emitter, sizeof(g_old_record.emitter), "%s", ap_emitter_gemm.name);
	g_old_record.measured_us = 1234.5;
	dflt.v[lx] = 0;   /* Apollo's kernel (lib=1 takes the default rule's tile only) */
	{
		bool moved = false;

		for (int i = 0; i < sp.n && !moved; i++)
			for (int j = 0; j < sp.knobs[i].n && !moved && !sp.knobs[i].late; j++) {
				int was = dflt.v[i];

				dflt.v[i] = sp.knobs[i].values[j];
				moved = dflt.v[i] != was && ap_sched_valid(B(&ap_emitter_gemm, m, &t), &dflt) == 1;
				if (!moved)
					dflt.v[i] = was;
			}
		ck_assert(moved);
	}
	for (int i = 0, len = 0; i < sp.n; i++)
		if (i != tx && i != lx)
			len += snprintf(g_old_record.config + len, sizeof(g_old_record.config) - (size_t)len,
					"%s%s=%d", len ? " " : "", sp.knobs[i].name, dflt.v[i]);
	ck_assert_int_eq(ap_tune_unit(&h, B(&ap_emitter_gemm, m, &t), 0, 100, 0, &s, &out, &err), 0);
	ck_assert_msg(out.kind == AP_TUNE_MEASURED, "record '%s' not used (kind %d)", g_old_record.config,
		      (int)out.kind);
	ck_assert_int_eq(s.v[tx], 0);
	for (int i = 0; i < sp.n; i++)
		ck_assert_int_eq(s.v[i], dflt.v[i]);
	/* without bk: searched */
	{
		char *p = strstr(g_old_record.config, "bk="), *e = strchr(p, ' ');

		if (e)
			memmove(p, e + 1, strlen(e + 1) + 1);
		else
			p[p > g_old_record.config ? -1 : 0] = '\0';
	}
	ck_assert_ptr_null(strstr(g_old_record.config, "bk="));
	ck_assert_int_eq(ap_tune_unit(&h, B(&ap_emitter_gemm, m, &t), 0, 100, 0, &s, &out, &err), 0);
	ck_assert_int_eq(out.kind, AP_TUNE_SEARCHED);
	mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* Split-K is priced (gm_traffic: a split block's pipeline fill and its
 * cluster's reduction stand outside the overlapped main loop) so that it
 * pays only where the tiles leave SMs idle: TF32 4096^3 on sm_90 (1,024
 * tiles of 128 x 128, 7.8 waves on 132 SMs) is not split -- it was split
 * 8 ways for the last wave's quantisation alone -- while a weight
 * gradient's product (64 x 64 over K = 65,536: 16 tiles of 16 x 16)
 * still is. */
START_TEST(splitk_only_for_idle_sms)
{
	ap_target_info t;

	ck_assert_int_eq(ap_cost_target("sm_90", &t), 0);
	t.allow_tf32 = true;
	for (int c = 0; c < 2; c++) {
		ap_graph *g = c ? matmul_graph(64, 64, 65536, false) : matmul_graph(4096, 4096, 4096, false);
		ap_mgraph *m = whole(g, AP_GROUP_MATMUL, AP_OP_MATMUL);
		ap_space sp;
		ap_sched dflt;
		ap_tune_result r;
		ap_error err;
		int sk;

		ck_assert_int_eq(ap_emitter_default(B(&ap_emitter_gemm, m, &t), &sp, &dflt, &err), 0);
		ck_assert_int_eq(ap_tune_search(B(&ap_emitter_gemm, m, &t), NULL, &r, &err), 0);
		sk = r.best.v[knob_ix(&sp, "splitk")];
		printf("check_tune: split-K %d (tile %d x %d) for %s (%.1f us modelled)\n", sk, r.best.v[0], r.best.v[1],
		       c ? "64 x 64 over K 65536" : "4096^3", r.best_us);
		if (c)
			ck_assert_int_gt(sk, 1);
		else
			ck_assert_int_eq(sk, 1);
		mgraph_free(m);
		ap_graph_free(g);
	}
}
END_TEST

START_TEST(never_worse_than_default)
{
	static const char *const targets[] = {"cpu", "sm_80", "sm_90"};
	static const int64_t shapes[][3] = {{64, 64, 64}, {128, 768, 768}, {4096, 128, 64}, {16, 1000, 512}};

	for (size_t ti = 0; ti < 3; ti++) {
		ap_target_info t;

		ck_assert_int_eq(ap_cost_target(targets[ti], &t), 0);
		for (size_t si = 0; si < 4; si++) {
			ap_graph *g = matmul_graph(shapes[si][0], shapes[si][1], shapes[si][2], false);
			ap_mgraph *m = whole(g, AP_GROUP_MATMUL, AP_OP_MATMUL);
			ap_tune_result r;
			ap_error err;
			ap_traffic tr;

			ck_assert_int_eq(ap_tune_search(B(&ap_emitter_gemm, m, &t), NULL, &r, &err), 0);
			ck_assert_msg(isfinite(r.default_us), "%s: the default is valid", targets[ti]);
			ck_assert_msg(r.best_us <= r.default_us, "%s %lld: tuned %.3f us > default %.3f us",
				      targets[ti], (long long)shapes[si][0], r.best_us, r.default_us);
			ck_assert_uint_ge(r.tried, 2);
			/* the chosen point builds, and its modelled time is what
			 * the search reported */
			ck_assert_int_eq(ap_sched_valid(B(&ap_emitter_gemm, m, &t), &r.best), 1);
			memset(&tr, 0, sizeof(tr));
			ck_assert_int_eq(ap_traffic_of(B(&ap_emitter_gemm, m, &t), &r.best, &tr), 0);
			ck_assert(fabs(ap_cost_schedule_us(&tr, &t) - r.best_us) < 1e-9);
			mgraph_free(m);
			ap_graph_free(g);
		}
	}
	/* the tile matters to the model: large products prefer large tiles on
	 * the GPU (fewer operand re-reads per multiply) */
	{
		ap_target_info t;
		ap_graph *g = matmul_graph(4096, 4096, 1024, false);
		ap_mgraph *m = whole(g, AP_GROUP_MATMUL, AP_OP_MATMUL);
		ap_sched s16, s128;
		ap_space sp;
		ap_error err;

		ck_assert_int_eq(ap_cost_target("sm_90", &t), 0);
		ck_assert_int_eq(ap_emitter_default(B(&ap_emitter_gemm, m, &t), &sp, &s16, &err), 0);
		s128 = s16;
		s16.v[knob_ix(&sp, "bm")] = 16;
		s16.v[knob_ix(&sp, "bn")] = 16;
		s16.v[knob_ix(&sp, "tm")] = 1;
		s16.v[knob_ix(&sp, "tn")] = 1;
		s128.v[knob_ix(&sp, "bm")] = 128;
		s128.v[knob_ix(&sp, "bn")] = 128;
		s128.v[knob_ix(&sp, "tm")] = 8;
		s128.v[knob_ix(&sp, "tn")] = 8;
		ck_assert(ap_tune_model_us(B(&ap_emitter_gemm, m, &t), &s128, NULL) <
			  ap_tune_model_us(B(&ap_emitter_gemm, m, &t), &s16, NULL));
		mgraph_free(m);
		ap_graph_free(g);
	}
}
END_TEST

START_TEST(sched_text)
{
	ap_graph *g = matmul_graph(128, 128, 64, false);
	ap_mgraph *m = whole(g, AP_GROUP_MATMUL, AP_OP_MATMUL);
	ap_target_info t;
	ap_space sp;
	ap_sched s, back;
	ap_error err;
	char *d;
	static const char *const bad[] = {
		"", "bm=64", "bm=64 bn=64 bk=16 tm=4 tn=4 stages=2 bm=64",   /* missing, repeated */
		"bm=64 bn=64 bk=16 tm=4 tn=4 stages=9",                      /* outside the space */
		"bm=64 bn=64 bk=16 tm=4 tn=4 stages=2x",                     /* trailing text */
		"bm=64 bn=64 bk=16 tm=4 tn=4 stage=2",                       /* unknown knob */
		"bm=-64 bn=64 bk=16 tm=4 tn=4 stages=2",
		"bm=64 bn=64 bk=16 tm=4 tn=4 stages=2;drop table",
		"bm=128 bn=128 bk=64 tm=1 tn=1 stages=3",                    /* 16384 threads: not valid */
	};

	ck_assert_int_eq(ap_cost_target("sm_90", &t), 0);
	ck_assert_int_eq(ap_emitter_default(B(&ap_emitter_gemm, m, &t), &sp, &s, &err), 0);
	d = ap_sched_describe(B(&ap_emitter_gemm, m, &t), &s);
	ck_assert_ptr_nonnull(d);
	ck_assert_int_eq(ap_sched_parse(B(&ap_emitter_gemm, m, &t), d, &back), 1);
	ck_assert_int_eq(memcmp(back.v, s.v, sizeof(s.v)), 0);
	ck_assert_ptr_eq(back.em, &ap_emitter_gemm);
	free(d);
	/* sm_90 has split-K for this K, and the library (lib) for this
	 * product: a text without splitk is refused; one without lib -- a
	 * record from before the knob (lower.h, `late`) -- means lib=0 */
	ck_assert_int_eq(ap_sched_parse(B(&ap_emitter_gemm, m, &t), "stages=3 tn=2 tm=2 bk=16 bn=32 bm=32 lib=0", &back), 0);
	ck_assert(sp.knobs[knob_ix(&sp, "lib")].late && !sp.knobs[knob_ix(&sp, "splitk")].late);
	ck_assert_int_eq(ap_sched_parse(B(&ap_emitter_gemm, m, &t), "stages=3 tn=2 splitk=2 tm=2 bk=16 bn=32 bm=32",
					&back), 1);
	ck_assert_int_eq(back.v[knob_ix(&sp, "lib")], 0);
	ck_assert_int_eq(ap_sched_parse(B(&ap_emitter_gemm, m, &t), "stages=3 tn=2 splitk=2 tm=2 bk=16 bn=32 bm=32 lib=0",
					&back), 1);
	ck_assert_int_eq(back.v[knob_ix(&sp, "lib")], 0);
	ck_assert_int_eq(back.v[knob_ix(&sp, "bm")], 32);
	ck_assert_int_eq(back.v[knob_ix(&sp, "stages")], 3);
	ck_assert_int_eq(back.v[knob_ix(&sp, "splitk")], 2);
	/* 4 blocks a cluster would leave each slice one K tile */
	ck_assert_int_eq(ap_sched_parse(B(&ap_emitter_gemm, m, &t), "stages=3 tn=2 splitk=4 tm=2 bk=16 bn=32 bm=32 lib=0",
					&back), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(ap_sched_parse(B(&ap_emitter_gemm, m, &t), bad[i], &back) == 0, "accepted '%s'",
			      bad[i]);
	mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* ---- records ------------------------------------------------------------------------ */

static char g_dir[256];

static ap_cache *fresh_cache(void)
{
	char path[300];
	ap_cache *c;
	ap_error err;

	snprintf(g_dir, sizeof(g_dir), "/tmp/apollo-check-tune-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(g_dir));
	snprintf(path, sizeof(path), "%s/cache.db", g_dir);
	ck_assert_int_eq(ap_cache_open(path, &c, &err), 0);
	return c;
}

static void drop_cache(ap_cache *c)
{
	char cmd[300];

	ap_cache_free(c);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
	ck_assert_int_eq(system(cmd), 0);
}

static ap_tune_record record(const char *config, double modelled, double measured,
			     const char *device)
{
	ap_tune_record r;

	memset(&r, 0, sizeof(r));
	snprintf(r.emitter, sizeof(r.emitter), "gemm");
	snprintf(r.config, sizeof(r.config), "%s", config);
	snprintf(r.method, sizeof(r.method), "%s", measured >= 0 ? "measured" : "exhaustive");
	snprintf(r.device, sizeof(r.device), "%s", device);
	r.sms = measured >= 0 ? 132 : 0;
	r.modelled_us = modelled;
	r.measured_us = measured;
	r.tried = 7;
	snprintf(r.candidates, sizeof(r.candidates), "%s;bm=16", config);
	return r;
}

START_TEST(records_in_the_cache)
{
	ap_cache *c = fresh_cache();
	uint8_t sig[32], other[32];
	ap_tune_record r, got;
	ap_cache_counts n;

	memset(sig, 7, sizeof(sig));
	memset(other, 8, sizeof(other));
	ck_assert_int_eq(ap_cache_tuning_get(c, sig, "sm_90", NULL, &got), 0);
	ck_assert_uint_eq(ap_cache_tuning_generation(c), 0);
	r = record("bm=64", 5.0, -1, "");
	ck_assert_int_eq(ap_cache_tuning_put(c, sig, "sm_90", &r), 0);
	ck_assert_uint_eq(ap_cache_tuning_generation(c), 0);   /* modelled: no new generation */
	ck_assert_int_eq(ap_cache_tuning_get(c, sig, "sm_90", NULL, &got), 1);
	ck_assert_str_eq(got.config, "bm=64");
	ck_assert(got.measured_us < 0);
	ck_assert(fabs(got.modelled_us - 5.0) < 1e-12);
	ck_assert_str_eq(got.candidates, "bm=64;bm=16");
	ck_assert_uint_eq(got.tried, 7);
	/* another target, another signature: not found */
	ck_assert_int_eq(ap_cache_tuning_get(c, sig, "sm_80", NULL, &got), 0);
	ck_assert_int_eq(ap_cache_tuning_get(c, other, "sm_90", NULL, &got), 0);
	/* a measured record wins over the model's; the model's stays */
	r = record("bm=32", 6.0, 3.5, "NVIDIA H100 80GB HBM3");
	ck_assert_int_eq(ap_cache_tuning_put(c, sig, "sm_90", &r), 0);
	ck_assert_uint_eq(ap_cache_tuning_generation(c), 1);
	ck_assert_int_eq(ap_cache_tuning_get(c, sig, "sm_90", NULL, &got), 1);
	ck_assert_str_eq(got.config, "bm=32");
	ck_assert_str_eq(got.method, "measured");
	ck_assert_str_eq(got.device, "NVIDIA H100 80GB HBM3");
	ck_assert_uint_eq(got.sms, 132);
	ck_assert(fabs(got.measured_us - 3.5) < 1e-12);
	ck_assert_int_eq(ap_cache_tuning_get(c, sig, "sm_90", "", &got), 1);
	ck_assert_str_eq(got.config, "bm=64");
	ck_assert_int_eq(ap_cache_tuning_get(c, sig, "sm_90", "NVIDIA H100 80GB HBM3", &got), 1);
	ck_assert_str_eq(got.config, "bm=32");
	ap_cache_get_counts(c, &n);
	ck_assert_uint_eq(n.tuning, 2);
	drop_cache(c);
}
END_TEST

/* ap_tune_hooks over an ap_cache, as the daemon's compile job does. */
typedef struct store_ctx {
	ap_cache *c;
	const char *target;
} store_ctx;

static int lookup_rec(void *user, const uint8_t sig[32], ap_tune_record *rec)
{
	store_ctx *s = user;

	return ap_cache_tuning_get(s->c, sig, s->target, NULL, rec);
}

/* As the daemon's lookup for a variant build: the model's record. */
static int lookup_model_rec(void *user, const uint8_t sig[32], ap_tune_record *rec)
{
	store_ctx *s = user;

	return ap_cache_tuning_get(s->c, sig, s->target, "", rec);
}

static void store_rec(void *user, const uint8_t sig[32], const ap_tune_record *rec)
{
	store_ctx *s = user;

	ck_assert_int_eq(ap_cache_tuning_put(s->c, sig, s->target, rec), 0);
}

/* The budget is counted in evaluations: a kernel's share of the build's,
 * searched to exactly that many; the wall-time safety limit ends a search
 * early only as a counted exception (capped), whose result is not kept as
 * a record, and once spent leaves kernels on their default rule. */
START_TEST(budget_counts_evaluations)
{
	ap_cache *c = fresh_cache();
	ap_graph *g = matmul_graph(256, 512, 128, false);
	ap_mgraph *m = whole(g, AP_GROUP_MATMUL, AP_OP_MATMUL);
	store_ctx sc = {c, "sm_90"};
	ap_tune_hooks h = {.target = "sm_90", .budget_evals = 10000, .lookup = lookup_rec,
			   .store = store_rec, .user = &sc};
	ap_target_info t;
	ap_tune_outcome out;
	ap_tune_record rec;
	ap_sched s, dflt;
	ap_space sp;
	ap_error err;

	/* shares: equal, at most the per-search cap */
	ck_assert_uint_eq(ap_tune_share(&h, 4), AP_TUNE_MAX_POINTS);
	ck_assert_uint_eq(ap_tune_share(&h, 100), 100);
	ck_assert_uint_eq(ap_tune_share(&h, 0), 0);
	h.search.max_points = 500;
	ck_assert_uint_eq(ap_tune_share(&h, 4), 500);
	h.search.max_points = 0;
	h.budget_evals = 0;
	ck_assert_uint_eq(ap_tune_share(&h, 1), 0);
	h.budget_evals = 10000;

	ck_assert_int_eq(ap_cost_target("sm_90", &t), 0);
	ck_assert_int_eq(ap_emitter_default(B(&ap_emitter_gemm, m, &t), &sp, &dflt, &err), 0);
	/* the safety limit spent before the kernel: its default rule, counted */
	ck_assert_int_eq(ap_tune_unit(&h, B(&ap_emitter_gemm, m, &t), 0, 50, -1, &s, &out, &err), 0);
	ck_assert_int_eq(out.kind, AP_TUNE_DEFAULT);
	ck_assert(out.capped);
	ck_assert_uint_eq(out.tried, 0);
	ck_assert_int_eq(memcmp(s.v, dflt.v, sizeof(dflt.v)), 0);
	ck_assert_int_eq(lookup_rec(&sc, out.sig, &rec), 0);
	/* a limit that passes during the search (checked every 16
	 * evaluations): cut short, counted, no record */
	ck_assert_int_eq(ap_tune_unit(&h, B(&ap_emitter_gemm, m, &t), 0, 1000, 1e-9, &s, &out, &err), 0);
	ck_assert_int_eq(out.kind, AP_TUNE_SEARCHED);
	ck_assert(out.capped);
	ck_assert_uint_eq(out.tried, 16);
	ck_assert_int_eq(lookup_rec(&sc, out.sig, &rec), 0);
	/* a share of 50 evaluations: exactly 50, whatever the time */
	ck_assert_int_eq(ap_tune_unit(&h, B(&ap_emitter_gemm, m, &t), 0, 50, 0, &s, &out, &err), 0);
	ck_assert_int_eq(out.kind, AP_TUNE_SEARCHED);
	ck_assert(!out.capped);
	ck_assert_uint_eq(out.tried, 50);
	ck_assert_int_eq(lookup_rec(&sc, out.sig, &rec), 1);
	ck_assert_uint_eq(rec.tried, 50);
	/* below two evaluations there is nothing to search */
	drop_cache(c);
	c = fresh_cache();
	sc.c = c;
	ck_assert_int_eq(ap_tune_unit(&h, B(&ap_emitter_gemm, m, &t), 0, 1, 0, &s, &out, &err), 0);
	ck_assert_int_eq(out.kind, AP_TUNE_DEFAULT);
	ck_assert(!out.capped);
	mgraph_free(m);
	ap_graph_free(g);
	drop_cache(c);
}
END_TEST

/* Builds g for `target` with tuning hooks over c; the schedule text of
 * the launch part computing node `name` goes to sched. */
static ap_program *build(const ap_graph *g, const char *target, ap_cache *c, char *sched,
			 size_t cap, const char *name)
{
	store_ctx sc = {c, target};
	ap_tune_hooks h = {.target = target, .budget_evals = 65536, .lookup = lookup_rec,
			   .store = store_rec, .user = &sc};
	ap_build_options o = {.target = target, .tune = &h};
	ap_error err;
	ap_program *p = ap_program_build(g, &o, &err);

	ck_assert_msg(p != NULL, "build: %s", err.msg);
	sched[0] = 0;
	for (int i = 0; i < p->n_launches; i++)
		for (int j = 0; j < p->launches[i].n_parts; j++) {
			const ap_launch_part *pt = &p->launches[i].parts[j];

			for (int q = 0; q < pt->n_nodes; q++)
				if (!strcmp(pt->nodes[q], name))
					snprintf(sched, cap, "%s", pt->schedule ? pt->schedule : "");
		}
	ck_assert_msg(sched[0], "no launch computes %s", name);
	return p;
}

/* apollo-client tune's builds: variant i puts the kernel on the i-th
 * candidate of the model's record (also when a measured record exists),
 * marks the launch part with the kernel's signature, and a variant past
 * the candidates falls back to the record's choice. */
START_TEST(variants_take_candidates)
{
	ap_cache *c = fresh_cache();
	ap_graph *g = matmul_graph(256, 512, 128, false);
	ap_mgraph *m = whole(g, AP_GROUP_MATMUL, AP_OP_MATMUL);
	ap_target_info t;
	ap_tune_record model, r;
	uint8_t sig[32];
	char s[256], cand[AP_TUNE_TOP][256], list[sizeof(model.candidates)];
	int n_cand = 0;
	ap_program *p;

	ck_assert_int_eq(AP_TUNE_TOP, AP_TUNE_CANDIDATES);   /* client and daemon agree */
	ck_assert_int_eq(ap_cost_target("sm_90", &t), 0);
	ck_assert_int_eq(ap_tune_signature(&ap_emitter_gemm, m, "sm_90", &t, 0, sig), 0);
	p = build(g, "sm_90", c, s, sizeof(s), "mm");   /* searched: the model's record */
	ap_program_free(p);
	ck_assert_int_eq(ap_cache_tuning_get(c, sig, "sm_90", "", &model), 1);
	snprintf(list, sizeof(list), "%s", model.candidates);
	for (char *tok = strtok(list, ";"); tok && n_cand < AP_TUNE_TOP;
	     tok = strtok(NULL, ";"))
		snprintf(cand[n_cand++], sizeof(cand[0]), "%s", tok);
	ck_assert_int_ge(n_cand, 2);
	ck_assert_str_eq(cand[0], model.config);        /* best first */
	/* a measured record does not hide the candidates from a variant build */
	r = model;
	snprintf(r.method, sizeof(r.method), "measured");
	snprintf(r.device, sizeof(r.device), "test device");
	r.sms = 132;
	r.measured_us = 2.0;
	memcpy(r.config, cand[n_cand - 1], sizeof(r.config));
	ck_assert_int_eq(ap_cache_tuning_put(c, sig, "sm_90", &r), 0);
	for (unsigned v = 1; v <= AP_TUNE_TOP; v++) {
		store_ctx sc = {c, "sm_90"};
		ap_tune_hooks h = {.target = "sm_90", .budget_evals = 65536, .variant = v,
				   .lookup = lookup_model_rec, .store = store_rec, .user = &sc};
		ap_build_options o = {.target = "sm_90", .tune = &h};
		ap_error err;
		const ap_launch_part *pt;

		p = ap_program_build(g, &o, &err);
		ck_assert_msg(p != NULL, "build: %s", err.msg);
		pt = &p->launches[0].parts[0];
		ck_assert(pt->tuned);
		ck_assert_int_eq(memcmp(pt->tune_sig, sig, 32), 0);
		ck_assert_str_eq(pt->schedule, (int)v <= n_cand ? cand[v - 1] : model.config);
		ck_assert(ap_tune_is_candidate(&model, pt->schedule));
		ap_program_free(p);
	}
	ck_assert(!ap_tune_is_candidate(&model, "bm=1"));
	mgraph_free(m);
	ap_graph_free(g);
	drop_cache(c);
}
END_TEST

/* y = x + c for a CONST c of n float32 values, value(i) each. */
static ap_graph *add_const_graph(int n, float (*value)(int))
{
	ap_graph *g = ap_graph_new("addc");
	float *d = calloc((size_t)n, sizeof(float));
	int x = tensor(g, "x", DIMS(8, n), AP_TENSOR_INPUT), c, y;
	ap_error err;

	for (int i = 0; i < n; i++)
		d[i] = value(i);
	c = ap_graph_add_tensor(g, "c", AP_DT_F32, 1, (int64_t[]){n}, AP_TENSOR_CONST, d,
				(size_t)n * sizeof(float));
	ck_assert_int_ge(c, 0);
	free(d);
	y = tensor(g, "y", DIMS(8, n), AP_TENSOR_VALUE);
	node(g, "add", AP_OP_ADD, 2, (int[]){x, c}, y);
	output(g, y);
	ck_assert_msg(ap_graph_validate(g, &err) == 0, "validate: %s", err.msg);
	return g;
}

static float ramp(int i) { return (float)i; }
static float ramp2(int i) { return (float)(2 * i + 1); }
static float one(int i) { (void)i; return 1.0f; }
static float two(int i) { (void)i; return 2.0f; }

/* Signatures follow the kernel: two layers whose bias (a buffer the kernel
 * reads) differs share one, while constants baked into the source -- at
 * most AP_CONST_BAKE_MAX elements, or uniform -- still tell kernels apart. */
START_TEST(signature_ignores_buffer_constants)
{
	static const struct { int n; float (*a)(int), (*b)(int); bool same; } cases[] = {
		{ 64, ramp, ramp2, true },    /* read from a buffer */
		{ 4, ramp, ramp2, false },    /* baked */
		{ 64, one, two, false },      /* uniform: baked as a scalar */
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ap_graph *ga = add_const_graph(cases[i].n, cases[i].a);
		ap_graph *gb = add_const_graph(cases[i].n, cases[i].b);
		uint8_t ha[32], hb[32], ka[32], kb[32];

		ck_assert_int_eq(ap_graph_hash(ga, ha), 0);
		ck_assert_int_eq(ap_graph_hash(gb, hb), 0);
		ck_assert_int_ne(memcmp(ha, hb, 32), 0);   /* different computations */
		ck_assert_int_eq(ap_graph_hash_kernel(ga, AP_CONST_BAKE_MAX, ka), 0);
		ck_assert_int_eq(ap_graph_hash_kernel(gb, AP_CONST_BAKE_MAX, kb), 0);
		ck_assert_msg((memcmp(ka, kb, 32) == 0) == cases[i].same, "case %zu", i);
		ap_graph_free(ga);
		ap_graph_free(gb);
	}
}
END_TEST


/* relu(A[M,K] x B[K,N]) with its inputs listed B first when `swap`. */
static ap_graph *matmul_inputs(int64_t M, int64_t N, int64_t K, bool swap)
{
	ap_graph *g = ap_graph_new("mm");
	int b = swap ? tensor(g, "b", DIMS(K, N), AP_TENSOR_INPUT) : -1;
	int a = tensor(g, "a", DIMS(M, K), AP_TENSOR_INPUT);
	int y, r;
	ap_error err;

	if (!swap)
		b = tensor(g, "b", DIMS(K, N), AP_TENSOR_INPUT);
	y = tensor(g, "y", DIMS(M, N), AP_TENSOR_VALUE);
	r = tensor(g, "r", DIMS(M, N), AP_TENSOR_VALUE);
	node(g, "mm", AP_OP_MATMUL, 2, (int[]){a, b}, y);
	node(g, "relu", AP_OP_RELU, 1, (int[]){y}, r);
	output(g, r);
	ck_assert_msg(ap_graph_validate(g, &err) == 0, "validate: %s", err.msg);
	return g;
}

/* The same kernel whose micro-graph lists its inputs in another order (the
 * layers of a transformer: the activation is a graph input in one, an
 * intermediate in the next) has one signature; the graph hash, which a
 * bundle's input positions depend on, still tells them apart; other
 * shapes are another kernel. */
START_TEST(signature_ignores_input_order)
{
	ap_graph *ga = matmul_inputs(128, 256, 64, false), *gb = matmul_inputs(128, 256, 64, true);
	ap_graph *gc = matmul_inputs(128, 256, 32, true);
	uint8_t ha[32], hb[32], ka[32], kb[32], kc[32];

	ck_assert_int_eq(ap_graph_hash(ga, ha), 0);
	ck_assert_int_eq(ap_graph_hash(gb, hb), 0);
	ck_assert_int_ne(memcmp(ha, hb, 32), 0);
	ck_assert_int_eq(ap_graph_hash_kernel(ga, AP_CONST_BAKE_MAX, ka), 0);
	ck_assert_int_eq(ap_graph_hash_kernel(gb, AP_CONST_BAKE_MAX, kb), 0);
	ck_assert_int_eq(ap_graph_hash_kernel(gc, AP_CONST_BAKE_MAX, kc), 0);
	ck_assert_int_eq(memcmp(ka, kb, 32), 0);
	ck_assert_int_ne(memcmp(ka, kc, 32), 0);
	ap_graph_free(ga);
	ap_graph_free(gb);
	ap_graph_free(gc);
}
END_TEST

START_TEST(records_reused_by_builds)
{
	ap_cache *c = fresh_cache();
	ap_graph *g1 = matmul_graph(256, 512, 128, false), *g2 = matmul_graph(256, 512, 128, true);
	char s1[256], s2[256], s3[256], want[256];
	ap_program *p;
	ap_mgraph *m;
	ap_target_info t;
	ap_tune_record r;
	uint8_t sig[32];
	ap_space sp;
	ap_sched dflt, alt;
	ap_error err;
	char *d;

	/* first build: searched, stored */
	p = build(g1, "sm_90", c, s1, sizeof(s1), "mm");
	ck_assert_uint_ge(p->tune_searched, 1);
	ck_assert_uint_eq(p->tune_hits, 0);
	ck_assert_uint_gt(p->tune_tried, 1);
	ap_program_free(p);
	/* a second graph with the same kernel: its record, no search for it */
	p = build(g2, "sm_90", c, s2, sizeof(s2), "mm");
	ck_assert_uint_eq(p->tune_hits, 1);
	ck_assert_uint_eq(p->tune_measured, 0);
	ck_assert_str_eq(s1, s2);
	ap_program_free(p);

	/* a measured record with another configuration wins */
	m = whole(g1, AP_GROUP_MATMUL, AP_OP_MATMUL);
	ck_assert_int_eq(ap_cost_target("sm_90", &t), 0);
	ck_assert_int_eq(ap_emitter_default(B(&ap_emitter_gemm, m, &t), &sp, &dflt, &err), 0);
	alt = dflt;
	alt.v[knob_ix(&sp, "stages")] = dflt.v[knob_ix(&sp, "stages")] == 2 ? 4 : 2;
	ck_assert_int_eq(ap_sched_valid(B(&ap_emitter_gemm, m, &t), &alt), 1);
	d = ap_sched_describe(B(&ap_emitter_gemm, m, &t), &alt);
	snprintf(want, sizeof(want), "%s", d);
	free(d);
	ck_assert_str_ne(want, s1);
	ck_assert_int_eq(ap_tune_signature(&ap_emitter_gemm, m, "sm_90", &t, 0, sig), 0);
	r = record(want, 9.0, 1.25, "test device");
	ck_assert_int_eq(ap_cache_tuning_put(c, sig, "sm_90", &r), 0);
	p = build(g2, "sm_90", c, s3, sizeof(s3), "mm");
	ck_assert_uint_eq(p->tune_measured, 1);
	ck_assert_str_eq(s3, want);
	ap_program_free(p);

	/* records of sm_90 are not used for sm_80 */
	p = build(g1, "sm_80", c, s3, sizeof(s3), "mm");
	ck_assert_uint_eq(p->tune_hits, 0);
	ck_assert_uint_ge(p->tune_searched, 1);
	ap_program_free(p);

	/* a record naming a configuration this build cannot parse: the
	 * search runs again, nothing fails */
	r = record("bm=7 bn=7", 1.0, 0.5, "test device");
	ck_assert_int_eq(ap_cache_tuning_put(c, sig, "sm_90", &r), 0);
	p = build(g1, "sm_90", c, s3, sizeof(s3), "mm");
	ck_assert_uint_eq(p->tune_hits, 0);
	ck_assert_str_eq(s3, s1);
	ap_program_free(p);

	mgraph_free(m);
	ap_graph_free(g1);
	ap_graph_free(g2);
	drop_cache(c);
}
END_TEST



/* ---- the library candidate (issue 25): cuBLASLt beside Apollo's GEMM ----------------- */

static uint16_t e2e_f16(double v);

/* A scalar constant of type dt (float16, bfloat16 or float) holding v
 * rounded to it. */
static int lib_scalar(ap_graph *g, ap_dtype dt, double v)
{
	char name[32];
	float f = (float)v;
	uint32_t bits;
	uint16_t h = e2e_f16(v);

	memcpy(&bits, &f, 4);
	if (dt == AP_DT_BF16)   /* the upper half, rounded to nearest even */
		h = (uint16_t)((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
	snprintf(name, sizeof(name), "c%d", g->n_tensors);
	return ap_graph_add_tensor(g, name, dt, 0, NULL, AP_TENSOR_CONST,
				   dt == AP_DT_F32 ? (const void *)&f : (const void *)&h, ap_dtype_size(dt));
}

/* A node op(x, y) (y < 0: op(x)) writing a new [M, N] tensor of dt (or
 * out when out >= 0); returns the tensor. */
static int lib_op(ap_graph *g, ap_dtype dt, ap_op op, int x, int y, int out, int64_t M, int64_t N)
{
	char name[32];

	snprintf(name, sizeof(name), "v%d", g->n_tensors);
	if (out < 0)
		out = ap_graph_add_tensor(g, name, dt, 2, (int64_t[]){M, N}, AP_TENSOR_VALUE, NULL, 0);
	snprintf(name, sizeof(name), "n%d", g->n_nodes);
	node(g, name, op, y < 0 ? 1 : 2, (int[]){x, y}, out);
	return out;
}

/* out = GELU(x) as the partition's expansion writes it from nodes of dt:
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (tanh) or
 * 0.5 x (1 + erf(x / sqrt 2)). */
static void lib_gelu(ap_graph *g, ap_dtype dt, int x, int out, bool tanh_form, int64_t M, int64_t N)
{
	int inner;

	if (tanh_form) {
		int x3 = lib_op(g, dt, AP_OP_MUL, lib_op(g, dt, AP_OP_MUL, x, x, -1, M, N), x, -1, M, N);
		int u = lib_op(g, dt, AP_OP_ADD, x,
			       lib_op(g, dt, AP_OP_MUL, lib_scalar(g, dt, 0.044715), x3, -1, M, N), -1, M, N);

		inner = lib_op(g, dt, AP_OP_TANH,
			       lib_op(g, dt, AP_OP_MUL, lib_scalar(g, dt, 0.7978845608028654), u, -1, M, N),
			       -1, -1, M, N);
	} else {
		inner = lib_op(g, dt, AP_OP_ERF,
			       lib_op(g, dt, AP_OP_MUL, x, lib_scalar(g, dt, 0.7071067811865476), -1, M, N),
			       -1, -1, M, N);
	}
	lib_op(g, dt, AP_OP_MUL, lib_op(g, dt, AP_OP_MUL, lib_scalar(g, dt, 0.5), x, -1, M, N),
	       lib_op(g, dt, AP_OP_ADD, lib_scalar(g, dt, 1.0), inner, -1, M, N), out, M, N);
}

/* The product A[M,K] x B[K,N] of dtype dt and an epilogue, by shape:
 *   0  relu(A B + bias[N])
 *   1  relu(exp(A) B)                  a prologue: never the library
 *   2  relu(A B + R[M,N])              a residual: C, beta = 1
 *   3  as 0 with B the transpose of a weight w[N,K] (a Linear layer)
 *   4  relu(A B) + R                   the residual after the activation: never
 *   5  gelu_tanh(0.5 A B + R + bias)   alpha 0.5, C, bias, GELU (tanh)
 *   6  gelu_erf(A B + bias)            erf's GELU, not cuBLASLt's: never
 * GELU is written out as the partition expands it (lib_gelu). */
static ap_graph *lib_graph(ap_dtype dt, int64_t M, int64_t N, int64_t K, int shape)
{
	ap_graph *g = ap_graph_new("lib");
	int a = ap_graph_add_tensor(g, "a", dt, 2, (int64_t[]){M, K}, AP_TENSOR_INPUT, NULL, 0);
	int b = ap_graph_add_tensor(g, "b", dt, 2, (int64_t[]){K, N}, AP_TENSOR_PARAM, NULL, 0);
	int y = ap_graph_add_tensor(g, "y", dt, 2, (int64_t[]){M, N}, AP_TENSOR_VALUE, NULL, 0);
	int o = ap_graph_add_tensor(g, "out", dt, 2, (int64_t[]){M, N}, AP_TENSOR_VALUE, NULL, 0);
	int bias = -1, res = -1, z, cur;
	ap_error err;

	g->inputs = realloc(g->inputs, 4 * sizeof(int));
	g->inputs[g->n_inputs++] = a;
	if (shape == 3) {
		/* a Linear layer: the weight stored [N, K], read transposed */
		int w = ap_graph_add_tensor(g, "w", dt, 2, (int64_t[]){N, K}, AP_TENSOR_PARAM, NULL, 0);
		int n = ap_graph_add_node(g, "tr", AP_OP_TRANSPOSE, 1, (int[]){w}, 1, &b);

		ck_assert_int_ge(n, 0);
		g->tensors[b].kind = AP_TENSOR_VALUE;
		ap_node_set_ints(g, n, "perm", (const int64_t[]){1, 0}, 2);
		shape = 0;
	}
	if (shape == 0 || shape == 5 || shape == 6)
		bias = ap_graph_add_tensor(g, "bias", dt, 1, (int64_t[]){N}, AP_TENSOR_PARAM, NULL, 0);
	if (shape == 2 || shape == 4 || shape == 5) {
		res = ap_graph_add_tensor(g, "res", dt, 2, (int64_t[]){M, N}, AP_TENSOR_INPUT, NULL, 0);
		g->inputs[g->n_inputs++] = res;
	}
	if (shape == 1) {
		int e = ap_graph_add_tensor(g, "e", dt, 2, (int64_t[]){M, K}, AP_TENSOR_VALUE, NULL, 0);

		node(g, "exp", AP_OP_EXP, 1, (int[]){a}, e);
		node(g, "mm", AP_OP_MATMUL, 2, (int[]){e, b}, y);
		node(g, "relu", AP_OP_RELU, 1, (int[]){y}, o);
		goto done;
	}
	node(g, "mm", AP_OP_MATMUL, 2, (int[]){a, b}, y);
	cur = y;
	if (shape == 5) {
		z = ap_graph_add_tensor(g, "scaled", dt, 2, (int64_t[]){M, N}, AP_TENSOR_VALUE, NULL, 0);
		node(g, "scale", AP_OP_MUL, 2, (int[]){cur, lib_scalar(g, dt, 0.5)}, z);
		cur = z;
	}
	if (res >= 0 && shape != 4) {
		z = ap_graph_add_tensor(g, "z", dt, 2, (int64_t[]){M, N}, AP_TENSOR_VALUE, NULL, 0);
		node(g, "residual", AP_OP_ADD, 2, (int[]){cur, res}, z);
		cur = z;
	}
	if (bias >= 0) {
		z = ap_graph_add_tensor(g, "zb", dt, 2, (int64_t[]){M, N}, AP_TENSOR_VALUE, NULL, 0);
		node(g, "add", AP_OP_ADD, 2, (int[]){cur, bias}, z);
		cur = z;
	}
	if (shape == 5 || shape == 6) {
		lib_gelu(g, dt, cur, o, shape == 5, M, N);
	} else if (shape == 4) {
		z = ap_graph_add_tensor(g, "r", dt, 2, (int64_t[]){M, N}, AP_TENSOR_VALUE, NULL, 0);
		node(g, "relu", AP_OP_RELU, 1, (int[]){cur}, z);
		node(g, "residual", AP_OP_ADD, 2, (int[]){z, res}, o);
	} else {
		node(g, "relu", AP_OP_RELU, 1, (int[]){cur}, o);
	}
done:
	output(g, o);
	ck_assert_msg(ap_graph_validate(g, &err) == 0, "validate: %s", err.msg);
	return g;
}

static int has_knob(const ap_space *sp, const char *name)
{
	for (int i = 0; i < sp->n; i++)
		if (!strcmp(sp->knobs[i].name, name))
			return i;
	return -1;
}

/* Where the knob exists and what the cost model makes of it: a large
 * float16 product with bias + ReLU at sm_90 gets lib (0, 1), lib=1 is one
 * point (the default tile); the default rule takes the library only where
 * the model prices it below a finite time of its own tile (here the model
 * calls the default tile a spill, so the rule keeps the kernel); the
 * search's candidates hold both sides and it picks the library for 4096^3
 * and the kernel for 256^3; a build (searched) carries the call on the
 * launch with its params bound and both modelled times; no knob on the
 * host, with a prologue, a residual after the activation or erf's GELU,
 * and a knob for a residual before it and for alpha + tanh's GELU
 * (float16, bfloat16 and float alike). */
START_TEST(library_knob)
{
	ap_target_info t, cpu;
	ap_graph *g = lib_graph(AP_DT_F16, 4096, 4096, 4096, 0);
	ap_mgraph *m = whole(g, AP_GROUP_MATMUL, AP_OP_MATMUL);
	ap_space sp;
	ap_sched dflt, s;
	ap_traffic tr;
	ap_error err;
	double own_us, lib_us;
	int li;

	ck_assert_int_eq(ap_cost_target("sm_90", &t), 0);
	ck_assert_int_eq(ap_cost_target("cpu", &cpu), 0);
	ck_assert_int_eq(ap_emitter_default(B(&ap_emitter_gemm, m, &t), &sp, &dflt, &err), 0);
	li = has_knob(&sp, "lib");
	ck_assert_int_ge(li, 0);
	ck_assert_int_eq(sp.knobs[li].n, 2);
	s = dflt;
	s.v[li] = 0;
	ck_assert_int_eq(ap_traffic_of(B(&ap_emitter_gemm, m, &t), &s, &tr), 0);
	own_us = ap_cost_schedule_us(&tr, &t);
	s.v[li] = 1;
	ck_assert_int_eq(ap_sched_valid(B(&ap_emitter_gemm, m, &t), &s), 1);
	ck_assert_int_eq(ap_traffic_of(B(&ap_emitter_gemm, m, &t), &s, &tr), 0);
	lib_us = ap_cost_schedule_us(&tr, &t);
	/* the library's model: 2 * 4096^3 flops at 0.8 of 989 TFLOP/s */
	ck_assert_double_eq_tol(tr.flops, 2.0 * 4096 * 4096 * 4096, 1);
	ck_assert_msg(lib_us >= 2.0 * 4096 * 4096 * 4096 / (0.8 * 989e6) && lib_us < 1.2 * 2.0 * 4096 * 4096 * 4096 / (0.8 * 989e6),
		      "library %.1f us", lib_us);
	/* the background tuner's refinement leaves the library's price alone:
	 * ptxas's figures are of the kernel beside it */
	ck_assert(tr.library);
	ck_assert_double_eq_tol(ap_tune_refined_us(&tr, &(ap_ptxas_stats){.registers = 255, .spill_store_bytes = 4096}, &t),
				lib_us, 1e-9);
	printf("check_tune: float16 4096^3 + bias + relu at sm_90: library %.1f us, Apollo's kernel %.1f us "
	       "modelled; default lib=%d\n", lib_us, own_us, dflt.v[li]);
	ck_assert_int_eq(dflt.v[li], isfinite(own_us) && lib_us < own_us);
	/* lib=1 is one point: another tile with lib=1 is not valid */
	s.v[0] = s.v[0] == 64 ? 128 : 64;
	ck_assert_int_eq(ap_sched_valid(B(&ap_emitter_gemm, m, &t), &s), 0);
	/* the search's candidates hold both sides where the model prices
	 * both (a measurement compares them): for 256^3 the default is the
	 * kernel, the library is among them */
	for (int c = 0; c < 2; c++) {
		ap_graph *g2 = c ? lib_graph(AP_DT_F16, 256, 256, 256, 0) : NULL;
		ap_mgraph *m2 = c ? whole(g2, AP_GROUP_MATMUL, AP_OP_MATMUL) : m;
		ap_tune_result r;
		int sides[2] = {0, 0};

		ck_assert_int_eq(ap_tune_search(B(&ap_emitter_gemm, m2, &t), NULL, &r, &err), 0);
		for (int i = 0; i < r.n_top; i++)
			sides[r.top[i].v[li] != 0]++;
		printf("check_tune: %s: default lib=%d, candidates: %d kernel tiles, %d library\n",
		       c ? "256^3" : "4096^3", r.dflt.v[li], sides[0], sides[1]);
		/* 4096^3: the model prices every kernel tile the walk reaches as a
		 * register spill (INFINITY), so no kernel tile is a candidate */
		ck_assert_int_ge(sides[0], c ? 1 : 0);
		ck_assert_int_eq(sides[1], 1);
		/* the search's pick: the library for 4096^3, the kernel for 256^3 */
		printf("check_tune: %s: the search picks lib=%d (%.1f us)\n", c ? "256^3" : "4096^3",
		       r.best.v[li], r.best_us);
		ck_assert_int_eq(r.best.v[li], c ? 0 : 1);
		for (int i = 1; i < r.n_top; i++)
			ck_assert(r.top_us[i] >= r.top_us[i - 1]);
		if (c) {
			mgraph_free(m2);
			ap_graph_free(g2);
		}
	}
	/* the host: no knob */
	ck_assert_int_eq(ap_emitter_default(B(&ap_emitter_gemm, m, &cpu), &sp, &dflt, &err), 0);
	ck_assert_int_lt(has_knob(&sp, "lib"), 0);
	mgraph_free(m);
	/* the build (searched under the cost model): the launch carries the call */
	{
		ap_cache *c = fresh_cache();
		char sched[256];
		ap_program *p = build(g, "sm_90", c, sched, sizeof(sched), "mm");
		const ap_launch *ln = NULL;
		const ap_kir_library *lib;
		const ap_kernel_src *ks;

		ck_assert_msg(p != NULL, "build: %s", err.msg);
		for (int i = 0; i < p->n_launches; i++)
			if (p->launches[i].library)
				ln = &p->launches[i];
		ck_assert_ptr_nonnull(ln);
		lib = ln->library;
		ks = &p->kernels[ln->kernel];
		ck_assert_int_eq(lib->m, 4096);
		ck_assert_int_eq(lib->n, 4096);
		ck_assert_int_eq(lib->k, 4096);
		ck_assert_int_eq(lib->epilogue, 6);   /* CUBLASLT_EPILOGUE_RELU_BIAS */
		ck_assert(!lib->trans_a && !lib->trans_b);
		ck_assert_int_eq(lib->lda, 4096);
		ck_assert_str_eq(ks->params[lib->a].name, "a");
		ck_assert_str_eq(ks->params[lib->b].name, "b");
		ck_assert_str_eq(ks->params[lib->bias].name, "bias");
		ck_assert_str_eq(ks->params[lib->d].name, "out");
		ck_assert(ks->params[lib->d].written);
		/* the build's own target figures (its block cap): both times
		 * noted, the library's the lower */
		ck_assert_msg(isfinite(lib->library_us) && lib->library_us > 0 && lib->library_us < lib->kernel_us,
			      "library %g us, kernel %g us", lib->library_us, lib->kernel_us);
		ck_assert_int_eq(ln->library_choice, AP_TUNE_SEARCHED);
		ck_assert_ptr_nonnull(strstr(ln->parts[0].schedule, "lib=1"));
		ap_program_free(p);
		drop_cache(c);
	}
	ap_graph_free(g);
	/* a prologue, a residual after the activation, erf's GELU: never
	 * the library; a residual before it, alpha and tanh's GELU: the
	 * library (checked in library_epilogues) */
	for (int shape = 1; shape <= 6; shape++)
		for (int d = 0; d < 3; d++) {
			const ap_dtype dts[] = { AP_DT_F16, AP_DT_BF16, AP_DT_F32 };

			if (shape == 3)   /* a transposed weight: library_end_to_end */
				continue;
			g = lib_graph(dts[d], 1024, 1024, 1024, shape);
			m = whole(g, AP_GROUP_MATMUL, AP_OP_MATMUL);
			ck_assert_int_eq(ap_emitter_default(B(&ap_emitter_gemm, m, &t), &sp, &dflt, &err), 0);
			ck_assert_msg((has_knob(&sp, "lib") >= 0) == (shape == 2 || shape == 5),
				      "shape %d %s: library knob %d", shape, ap_dtype_name(dts[d]),
				      has_knob(&sp, "lib"));
			mgraph_free(m);
			ap_graph_free(g);
		}
}
END_TEST

/* A measured record decides between the two: one that measured the
 * library faster puts the launch on it (lib=1, the call attached, chosen
 * by the measured record), one that measured Apollo's kernel faster on
 * the kernel (lib=0, no call), whatever the cost model says. */
START_TEST(library_measured_record)
{
	ap_cache *c = fresh_cache();
	ap_graph *g = lib_graph(AP_DT_F16, 2048, 2048, 2048, 0);
	ap_mgraph *m = whole(g, AP_GROUP_MATMUL, AP_OP_MATMUL);
	ap_target_info t;
	ap_space sp;
	ap_sched dflt, s;
	ap_error err;
	uint8_t sig[32];
	int li;

	ck_assert_int_eq(ap_cost_target("sm_90", &t), 0);
	ck_assert_int_eq(ap_emitter_default(B(&ap_emitter_gemm, m, &t), &sp, &dflt, &err), 0);
	li = knob_ix(&sp, "lib");
	ck_assert_int_eq(ap_tune_signature(&ap_emitter_gemm, m, "sm_90", &t, 0, sig), 0);
	for (int side = 0; side < 2; side++) {
		char want[256], got[256];
		ap_tune_record r;
		ap_program *p;
		char *d;
		const ap_launch *ln = NULL;

		s = dflt;
		s.v[li] = side;
		ck_assert_int_eq(ap_sched_valid(B(&ap_emitter_gemm, m, &t), &s), 1);
		d = ap_sched_describe(B(&ap_emitter_gemm, m, &t), &s);
		snprintf(want, sizeof(want), "%s", d);
		free(d);
		/* measured: this side 100 us, the other one never measured faster */
		r = record(want, 500.0, 100.0, "test device");
		ck_assert_int_eq(ap_cache_tuning_put(c, sig, "sm_90", &r), 0);
		p = build(g, "sm_90", c, got, sizeof(got), "mm");
		ck_assert_uint_eq(p->tune_measured, 1);
		ck_assert_str_eq(got, want);
		for (int i = 0; i < p->n_launches; i++)
			for (int q = 0; q < p->launches[i].parts[0].n_nodes; q++)
				if (!strcmp(p->launches[i].parts[0].nodes[q], "mm"))
					ln = &p->launches[i];
		ck_assert_ptr_nonnull(ln);
		if (side) {
			ck_assert_ptr_nonnull(ln->library);
			ck_assert_int_eq(ln->library_choice, AP_TUNE_MEASURED);
		} else {
			ck_assert_ptr_null(ln->library);
		}
		ap_program_free(p);
	}
	mgraph_free(m);
	ap_graph_free(g);
	drop_cache(c);
}
END_TEST

/* A stitched softmax over R rows of N: its modelled arithmetic counts each
 * value once per element of its own tensor (the row's maximum and sum once
 * per row, read from registers by the elementwise ops), times the kernel's
 * passes over the row -- not the inline model's re-evaluation of a
 * reduction at every element that reads it (R N^2). */
START_TEST(stitched_flops_count_reductions_once)
{
	enum { R = 64, N = 1024 };
	ap_graph *g = ap_graph_new("softmax");
	int x = tensor(g, "x", DIMS(R, N), AP_TENSOR_INPUT);
	int mx = tensor(g, "mx", DIMS(R, 1), AP_TENSOR_VALUE);
	int d = tensor(g, "d", DIMS(R, N), AP_TENSOR_VALUE);
	int e = tensor(g, "e", DIMS(R, N), AP_TENSOR_VALUE);
	int sm = tensor(g, "sm", DIMS(R, 1), AP_TENSOR_VALUE);
	int y = tensor(g, "y", DIMS(R, N), AP_TENSOR_VALUE);
	ap_target_info ti;
	ap_mgraph *m;
	ap_space sp;
	ap_sched s;
	ap_traffic tr;
	ap_error err;

	node(g, "max", AP_OP_REDUCE_MAX, 1, (int[]){x}, mx);
	ap_node_set_ints(g, g->n_nodes - 1, "axes", (const int64_t[]){1}, 1);
	node(g, "sub", AP_OP_SUB, 2, (int[]){x, mx}, d);
	node(g, "exp", AP_OP_EXP, 1, (int[]){d}, e);
	node(g, "sum", AP_OP_REDUCE_SUM, 1, (int[]){e}, sm);
	ap_node_set_ints(g, g->n_nodes - 1, "axes", (const int64_t[]){1}, 1);
	node(g, "div", AP_OP_DIV, 2, (int[]){e, sm}, y);
	output(g, y);
	ck_assert_msg(ap_graph_validate(g, &err) == 0, "validate: %s", err.msg);
	m = whole(g, AP_GROUP_STITCHED, AP_OP_REDUCE_MAX);
	ck_assert_int_eq(ap_cost_target("sm_90", &ti), 0);
	ck_assert_int_eq(ap_emitter_default(B(&ap_emitter_stitched, m, &ti), &sp, &s, &err), 0);
	ck_assert_int_eq(ap_traffic_of(B(&ap_emitter_stitched, m, &ti), &s, &tr), 0);
	/* five ops of R x N evaluations each (the reductions read N per row),
	 * times at most three passes (two reduction levels and the outputs') */
	ck_assert_msg(tr.flops >= 5.0 * R * N && tr.flops <= 15.0 * R * N, "%g modelled operations",
		      tr.flops);
	mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* softmax(Q K^T / sqrt(D)) V over H heads of S queries and keys, head dim
 * D, in type dt (the pattern the importer leaves for attention). */
static ap_graph *attention_graph(int64_t H, int64_t S, int64_t D, ap_dtype dt)
{
	ap_graph *g = ap_graph_new("att");
	int q = tensor(g, "q", DIMS(H, S, D), AP_TENSOR_INPUT), k = tensor(g, "k", DIMS(H, S, D), AP_TENSOR_INPUT);
	int v = tensor(g, "v", DIMS(H, S, D), AP_TENSOR_INPUT), kt = tensor(g, "kt", DIMS(H, D, S), AP_TENSOR_VALUE);
	int y = tensor(g, "y", DIMS(H, S, S), AP_TENSOR_VALUE), sc = tensor(g, "sc", DIMS(H, S, S), AP_TENSOR_VALUE);
	int mx = tensor(g, "mx", DIMS(H, S, 1), AP_TENSOR_VALUE), d = tensor(g, "d", DIMS(H, S, S), AP_TENSOR_VALUE);
	int e = tensor(g, "e", DIMS(H, S, S), AP_TENSOR_VALUE), l = tensor(g, "l", DIMS(H, S, 1), AP_TENSOR_VALUE);
	int p = tensor(g, "p", DIMS(H, S, S), AP_TENSOR_VALUE), o = tensor(g, "o", DIMS(H, S, D), AP_TENSOR_VALUE);
	int64_t axis = 2;
	uint8_t scale[4];
	int c, n;
	ap_error err;

	ap_elem_set(scale, dt, 0, 1 / sqrt((double)D));
	c = ap_graph_add_tensor(g, "c", dt, 0, NULL, AP_TENSOR_CONST, scale, ap_dtype_size(dt));
	ck_assert_int_ge(c, 0);
	node(g, "kt", AP_OP_TRANSPOSE, 1, (int[]){k}, kt);
	ap_node_set_ints(g, g->n_nodes - 1, "perm", (const int64_t[]){0, 2, 1}, 3);
	node(g, "qk", AP_OP_MATMUL, 2, (int[]){q, kt}, y);
	node(g, "scale", AP_OP_MUL, 2, (int[]){y, c}, sc);
	node(g, "max", AP_OP_REDUCE_MAX, 1, (int[]){sc}, mx);
	node(g, "sub", AP_OP_SUB, 2, (int[]){sc, mx}, d);
	node(g, "exp", AP_OP_EXP, 1, (int[]){d}, e);
	node(g, "sum", AP_OP_REDUCE_SUM, 1, (int[]){e}, l);
	node(g, "div", AP_OP_DIV, 2, (int[]){e, l}, p);
	node(g, "pv", AP_OP_MATMUL, 2, (int[]){p, v}, o);
	for (n = 0; n < g->n_nodes; n++)
		if (g->nodes[n].op == AP_OP_REDUCE_MAX || g->nodes[n].op == AP_OP_REDUCE_SUM) {
			ap_node_set_ints(g, n, "axes", &axis, 1);
			ap_node_set_int(g, n, "keepdims", 1);
		}
	for (int t = 0; t < g->n_tensors; t++)
		g->tensors[t].dtype = dt;
	output(g, o);
	ck_assert_msg(ap_graph_validate(g, &err) == 0, "validate: %s", err.msg);
	return g;
}

/* The tensor-core attention prices its products at the operands' rate:
 * float32 with --allow-tf32 at TF32's (half float16's on sm_80 and
 * sm_90; it was priced at float16's), float16 at float16's. */
START_TEST(attention_tf32_rate)
{
	for (int f32 = 0; f32 < 2; f32++) {
		ap_graph *g = attention_graph(8, 1024, 64, f32 ? AP_DT_F32 : AP_DT_F16);
		ap_mgraph *m = whole(g, AP_GROUP_ATTENTION, AP_OP_MATMUL);
		ap_target_info t;
		ap_space sp;
		ap_sched s;
		ap_traffic tr, half_rate;
		ap_error err;
		const ap_bound *b;

		ck_assert_int_eq(ap_cost_target("sm_80", &t), 0);
		t.allow_tf32 = true;
		ck_assert(t.tf32_gflops > 0 && t.tf32_gflops < t.tc_gflops);
		b = B(&ap_emitter_attention, m, &t);
		ck_assert_int_eq(ap_emitter_default(b, &sp, &s, &err), 0);
		ck_assert_int_eq(ap_traffic_of(b, &s, &tr), 0);
		ck_assert(tr.tensor_cores);
		ck_assert_int_eq(tr.tf32, f32);
		/* the same traffic at float16's rate: faster where TF32 */
		half_rate = tr;
		half_rate.tf32 = false;
		printf("check_tune: attention 8 x 1024 x 1024, head dim 64, %s on sm_80: %.1f us modelled "
		       "(%.1f us at float16's rate)\n", f32 ? "float32 (TF32)" : "float16",
		       ap_cost_schedule_us(&tr, &t), ap_cost_schedule_us(&half_rate, &t));
		if (f32)
			ck_assert(ap_cost_schedule_us(&tr, &t) > ap_cost_schedule_us(&half_rate, &t));
		mgraph_free(m);
		ap_graph_free(g);
	}
}
END_TEST

/* The wgmma attention at issue 25's lengths (2,048 queries and keys,
 * head dims 128 and 64, float16, sm_90a): the search under the cost
 * model takes two query warpgroups (warps=8: K and V read once per 128
 * query rows from L2) and key tiles of 64 or 128 -- Q re-read from shared
 * memory, and the output rescaled, once per key tile (attention.c
 * tc_traffic) -- where the default had 16 or 32.  With the forms not yet
 * run on a GPU asked for, FlashAttention-3's structure at 128 keys: the
 * warp-specialised TMA form with the overlap and ping-pong (overlap=2),
 * its producer warpgroup's registers given to the two query warpgroups
 * (setmaxnreg: 24 and 240 of the 168 a thread the launch of 384 leaves;
 * without them 128 keys would not fit); one query warpgroup an SM, its
 * softmax hidden only behind its own O += P V, is modelled slower.  The chosen kernels compile for sm_90a
 * without spills, the split ones at exactly the launch's registers
 * (ptxas's count for a kernel holding setmaxnreg is its launch bound's:
 * were it fewer, the query warpgroups' setmaxnreg.inc would wait for
 * registers the pool never gets).  The in-flight copies keep DRAM time
 * from the few-resident-threads stretch (cost.c). */
START_TEST(attention_long_sequences)
{
	static const struct {
		int64_t H, D;
		bool asked;
		int warps, keys, overlap, tma;
	} cs[] = {
		{8, 128, false, 8, 128, 0, 0},
		{8, 128, true, 8, 128, 2, 2},
		{16, 64, false, 4, 128, 0, 0},
		{16, 64, true, 8, 128, 2, 2},
	};
	bool nvrtc = ap_nvrtc_load(&(ap_error){0}) == 0;

	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		ap_graph *g = attention_graph(cs[i].H, 2048, cs[i].D, AP_DT_F16);
		ap_mgraph *m = whole(g, AP_GROUP_ATTENTION, AP_OP_MATMUL);
		ap_target_info t;
		ap_tune_result r;
		ap_sched small;
		ap_error err;
		const ap_bound *b;
		double small_us;

		ck_assert_int_eq(ap_cost_target("sm_90a", &t), 0);
		t.unvalidated = t.tma = cs[i].asked;
		/* apollod's caps (pipeline.c): 256 threads that compute, a
		 * producer warpgroup on top */
		t.max_threads_per_block = 256;
		t.ws_threads = 128;
		b = B(&ap_emitter_attention, m, &t);
		ck_assert_int_eq(ap_tune_search(b, NULL, &r, &err), 0);
		printf("check_tune: attention 2048 x 2048, head dim %lld, float16 on sm_90a%s: warps=%d keys=%d "
		       "overlap=%d tma=%d, %.1f us modelled (default warps=%d keys=%d)\n", (long long)cs[i].D,
		       cs[i].asked ? " (--unvalidated)" : "", r.best.v[0], r.best.v[1], r.best.v[2], r.best.v[3],
		       r.best_us, r.dflt.v[0], r.dflt.v[1]);
		ck_assert_int_eq(r.best.n, 4);
		ck_assert_int_eq(r.best.v[0], cs[i].warps);
		ck_assert_int_eq(r.best.v[3], cs[i].tma);
		if (cs[i].asked) {
			ap_traffic tr;
			ap_sched one = r.best;

			/* one query warpgroup an SM (its producer's registers
			 * leave room for no second block) */
			one.v[0] = 4;
			one.v[2] = 1;
			one.v[3] = 2;
			ck_assert_int_eq(ap_sched_valid(b, &one), 1);
			ck_assert_int_eq(ap_traffic_of(b, &one, &tr), 0);
			ck_assert_uint_eq(ap_cost_blocks_per_sm_regs(&t, tr.threads + 128, tr.shared_bytes, tr.regs), 1);
			ck_assert_msg(ap_tune_model_us(b, &one, NULL) > 1.15 * r.best_us, "one warpgroup %.1f us against %.1f us",
				      ap_tune_model_us(b, &one, NULL), r.best_us);
			if (cs[i].D == 64) {
				/* the persistent grid of the TMA form without a
				 * producer: two blocks an SM by registers (about 200
				 * a thread), not the three shared memory holds */
				ap_lower_options lo = {0, &one, true};
				ap_kir_kernel *k;

				one.v[3] = 1;
				ck_assert_int_eq(ap_sched_valid(b, &one), 1);
				k = ap_lower(b, "att_grid", &lo, NULL, &err);
				ck_assert_msg(k != NULL, "%s", err.msg);
				ck_assert_uint_eq(k->grid[0], 2 * t.sm_count);
				ap_kir_kernel_free(k);
			}
		}
		ck_assert_int_eq(r.best.v[1], cs[i].keys);
		ck_assert_int_eq(r.best.v[2], cs[i].overlap);
		/* 16 keys a tile: four to eight times Q's shared-memory reads
		 * and the output's rescales */
		small = r.best;
		small.v[1] = 16;
		small_us = ap_tune_model_us(b, &small, NULL);
		ck_assert_msg(small_us > 1.15 * r.best_us, "keys=16 %.1f us against %.1f us", small_us, r.best_us);
		if (cs[i].asked && cs[i].D == 128) {
			ap_traffic tr;

			/* a thread's registers at the launch: the split's */
			ck_assert_int_eq(ap_traffic_of(b, &r.best, &tr), 0);
			ck_assert_uint_eq(tr.regs, 168);
		}
		if (nvrtc) {
			ap_lower_options lo = {0, &r.best, true};
			ap_kir_kernel *k = ap_lower(b, "att_long", &lo, NULL, &err);
			ap_ptxas_stats ps;
			char *cuda;

			ck_assert_msg(k != NULL, "%s", err.msg);
			cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
			ck_assert_ptr_nonnull(cuda);
			ck_assert_msg(ap_nvrtc_ptxas_stats(cuda, "att_long", "sm_90a", &ps, &err) == 0, "%s", err.msg);
			ck_assert_msg(ps.spill_store_bytes == 0 && ps.spill_load_bytes == 0, "spills %d / %d bytes",
				      ps.spill_store_bytes, ps.spill_load_bytes);
			ck_assert_int_le(ps.registers, 255);
			/* the query warpgroups' wgmma pipelined: the roles'
			 * branch warp-uniform (print.c print_roles_cuda) */
			ck_assert_msg(!ps.wgmma_serialized, "ptxas serialised the wgmma (C7520)");
			if (r.best.v[0] >= 8 && r.best.v[3] >= 2) {
				ck_assert_ptr_nonnull(strstr(cuda, "setmaxnreg.inc.sync.aligned.u32 240;"));
				ck_assert_ptr_nonnull(strstr(cuda, "setmaxnreg.dec.sync.aligned.u32 24;"));
				ck_assert_int_eq(ps.registers, 168);
			}
			if (r.best.v[2] == 2)   /* ping-pong's turns */
				ck_assert_ptr_nonnull(strstr(cuda, "__shared__ long long turn[2];"));
			printf("check_tune: ... %d registers, no spills\n", ps.registers);
			free(cuda);
			ap_kir_kernel_free(k);
		}
		mgraph_free(m);
		ap_graph_free(g);
	}
	{
		/* a block of 256 threads, one resident an SM (an eighth of its
		 * threads): DRAM time stretched four times without copies in
		 * flight, not with 32 KiB a block (more than a microsecond of
		 * the SM's share of 3.35 TB/s) */
		ap_target_info t;
		ap_traffic tr = {0};
		double slow, fast;

		ck_assert_int_eq(ap_cost_target("sm_90a", &t), 0);
		tr.bytes_read = 64e6;
		tr.blocks = t.sm_count;
		tr.threads = 256;
		tr.shared_bytes = 150 * 1024;
		slow = ap_cost_schedule_us(&tr, &t);
		tr.inflight_bytes = 32 * 1024;
		fast = ap_cost_schedule_us(&tr, &t);
		ck_assert_msg(fabs((slow - t.launch_us) / (fast - t.launch_us) - 4) < 1e-9, "%.2f us against %.2f us",
			      slow, fast);
	}
}
END_TEST

/* ---- refinement with ptxas and the background tuner ---------------------------------- */

START_TEST(refined_us_reads_ptxas)
{
	ap_graph *g = matmul_graph(4096, 4096, 32, false);
	ap_mgraph *m = whole(g, AP_GROUP_MATMUL, AP_OP_MATMUL);
	ap_target_info ti;
	const ap_emitter *em = &ap_emitter_gemm;
	ap_space sp;
	ap_sched s;
	ap_traffic tr;
	ap_ptxas_stats ps = {0};
	ap_error err;
	double base, more, spilled;

	ck_assert_int_eq(ap_cost_target("sm_90", &ti), 0);
	ck_assert_int_eq(ap_emitter_default(B(em, m, &ti), &sp, &s, &err), 0);
	memset(&tr, 0, sizeof(tr));
	ck_assert_int_eq(ap_traffic_of(B(em, m, &ti), &s, &tr), 0);
	ck_assert_uint_gt(tr.regs, 0);
	/* synchronous loads (no copies in flight): fewer resident threads
	 * stretch DRAM's time */
	tr.inflight_bytes = 0;
	base = ap_cost_schedule_us(&tr, &ti);
	ck_assert(isfinite(base) && base > 0);
	/* ptxas agreeing with the estimate: the model's own time */
	ps.registers = (int)tr.regs;
	ck_assert_double_eq_tol(ap_tune_refined_us(&tr, &ps, &ti), base, 1e-9 * base);
	/* 255 registers: fewer blocks resident per SM, more waves */
	ck_assert_uint_lt(ap_cost_blocks_per_sm_regs(&ti, tr.threads, tr.shared_bytes, 255),
			  ap_cost_blocks_per_sm_regs(&ti, tr.threads, tr.shared_bytes, tr.regs));
	more = ap_tune_refined_us(&tr, &(ap_ptxas_stats){ .registers = 255 }, &ti);
	ck_assert_msg(more > base, "255 registers: %g us, estimate: %g us", more, base);
	/* 64 KiB of spills per thread dominate every other resource */
	spilled = ap_tune_refined_us(&tr, &(ap_ptxas_stats){ .registers = (int)tr.regs,
							     .spill_store_bytes = 32768,
							     .spill_load_bytes = 32768 }, &ti);
	ck_assert_msg(spilled > 2 * base, "spilled %g us, base %g us", spilled, base);
	/* static shared memory past the SM's: the block does not fit */
	ck_assert(isinf(ap_tune_refined_us(&tr, &(ap_ptxas_stats){ .shared_bytes = 1 << 22 }, &ti)));
	mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* Compiles g for sm_90 (PTX) with tune_variant v: the response. */
static Apollo__CompileResponse *compile_variant(ap_compiler *c, Apollo__Graph *pb, unsigned v)
{
	Apollo__CompileRequest req = APOLLO__COMPILE_REQUEST__INIT;
	Apollo__CompileOptions o = APOLLO__COMPILE_OPTIONS__INIT;
	Apollo__DeviceInfo dev = APOLLO__DEVICE_INFO__INIT;
	Apollo__CompileResponse *r;

	/* the GPU the stand-in driver answers as: its measured records apply */
	dev.name = "Apollo stand-in GPU";
	dev.sm_count = 132;
	req.source_case = APOLLO__COMPILE_REQUEST__SOURCE_GRAPH;
	req.graph = pb;
	req.target = "sm_90";
	req.output = APOLLO__OUTPUT_KIND__OUTPUT_PTX;
	req.device = &dev;
	o.tune_variant = v;
	req.options = &o;
	r = ap_compile_run(c, &req);
	ck_assert_ptr_nonnull(r);
	ck_assert_msg(r->result_case == APOLLO__COMPILE_RESPONSE__RESULT_BUNDLE, "compile: %s",
		      r->result_case == APOLLO__COMPILE_RESPONSE__RESULT_ERROR ? r->error->message : "?");
	return r;
}

/* The launch of bundle b running the tuned kernel `sig` alone: its index,
 * or -1. */
static int tuned_launch(const Apollo__Bundle *b, const uint8_t sig[32])
{
	for (size_t l = 0; l < b->n_plan; l++)
		if (b->plan[l]->n_parts == 1 && b->plan[l]->parts[0]->tune_signature.len == 32 &&
		    !memcmp(b->plan[l]->parts[0]->tune_signature.data, sig, 32))
			return (int)l;
	return -1;
}

START_TEST(background_tuner)
{
	char so[300];
	const char *b = getenv("APOLLO_BUILD");
	double (*fake_ms)(unsigned, unsigned, unsigned);
	void *h;
	ap_graph *g = matmul_graph(256, 256, 256, false);
	Apollo__Graph *pb = ap_graph_to_pb(g);
	ap_compiler_options co = { .threads = 1,
				   .autotune = { .refine = true, .measure = true, .runs = 5,
						 .timer = &ap_runtime_kernel_timer,
						 .warmup = 1 } };
	Apollo__CompileResponse *r;
	ap_compiler *c;
	ap_cache *cache;
	ap_compile_counters cc;
	ap_tune_record model, meas;
	uint8_t sig[32];
	double best_us = INFINITY;
	int l, n_cand = 1;
	ap_error err;

	if (ap_nvrtc_load(&err)) {
		AP_SKIP("nvrtc", "background_tuner: skipped, no NVRTC (%s)", err.msg);
		goto out_graph;
	}
	snprintf(so, sizeof(so), "%s/tests/libcuda-standin.so", b && *b ? b : "build");
	ck_assert_msg(access(so, R_OK) == 0, "no stand-in driver at %s", so);
	setenv("APOLLO_LIBCUDA", so, 1);
	h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	ck_assert_ptr_nonnull(h);
	*(void **)&fake_ms = dlsym(h, "fake_launch_ms");
	ck_assert_ptr_nonnull(fake_ms);
	cache = fresh_cache();
	c = ap_compiler_new(cache, &co);
	ck_assert_ptr_nonnull(c);

	/* the first compile searches the GEMM: one job */
	r = compile_variant(c, pb, 0);
	ck_assert_uint_eq(r->bundle->stats->tune_searched, 1);
	for (l = 0; l < (int)r->bundle->n_plan; l++)
		if (r->bundle->plan[l]->parts[0]->tune_signature.len == 32)
			break;
	ck_assert_int_lt(l, (int)r->bundle->n_plan);
	memcpy(sig, r->bundle->plan[l]->parts[0]->tune_signature.data, 32);
	ap_compile_response_free(r);
	ck_assert(ap_autotune_wait_idle(ap_compiler_autotune(c), 120000));
	ap_compiler_get_counters(c, &cc);
	ck_assert_uint_eq(cc.autotune.jobs, 1);
	ck_assert_uint_eq(cc.autotune.failed, 0);
	ck_assert_uint_eq(cc.autotune.refined, 1);
	ck_assert_uint_eq(cc.autotune.measured, 1);

	/* the model's record, refined: candidates as many as were compiled */
	ck_assert_int_eq(ap_cache_tuning_get(cache, sig, "sm_90", "", &model), 1);
	ck_assert_str_eq(model.method, "ptxas");
	for (const char *p = model.candidates; *p; p++)
		n_cand += *p == ';';
	ck_assert_int_ge(n_cand, 2);
	ck_assert_uint_eq(cc.autotune.compiled, (uint64_t)n_cand);
	ck_assert_uint_ge(cc.autotune.timed, (uint64_t)n_cand);

	/* its time: the chosen configuration's kernel, compiled here with ptxas */
	for (unsigned v = 1; v <= AP_TUNE_TOP; v++) {
		Apollo__CompileRequest req = APOLLO__COMPILE_REQUEST__INIT;
		Apollo__CompileOptions o = APOLLO__COMPILE_OPTIONS__INIT;
		ap_graph *gg;
		ap_program *p;

		req.source_case = APOLLO__COMPILE_REQUEST__SOURCE_GRAPH;
		req.graph = pb;
		req.target = "sm_90";
		o.tune_variant = v;
		req.options = &o;
		ck_assert_int_eq(ap_compiler_build_program(c, &req, &gg, &p, &err), 0);
		for (int i = 0; i < p->n_launches; i++) {
			const ap_launch_part *pt = &p->launches[i].parts[0];
			ap_ptxas_stats ps;
			const ap_kernel_src *k = &p->kernels[p->launches[i].kernel];
			ap_target_info ti;

			if (!pt->tuned || memcmp(pt->tune_sig, sig, 32) || strcmp(pt->schedule, model.config))
				continue;
			ck_assert_int_eq(ap_nvrtc_ptxas_stats(k->src, k->name, "sm_90", &ps, &err), 0);
			ck_assert_int_eq(ap_cost_target("sm_90", &ti), 0);
			ck_assert_double_eq_tol(model.modelled_us, ap_tune_refined_us(&pt->traffic, &ps, &ti),
						1e-9 * model.modelled_us);
			v = AP_TUNE_TOP;   /* found */
		}
		ap_program_free(p);
		ap_graph_free(gg);
	}

	/* the measured record: the candidate the stand-in times fastest */
	ck_assert_int_eq(ap_cache_tuning_get(cache, sig, "sm_90", "Apollo stand-in GPU|132", &meas),
			 1);
	ck_assert_str_eq(meas.method, "measured");
	for (unsigned v = 1; v <= AP_TUNE_TOP; v++) {
		const Apollo__Kernel *k;
		double us;

		r = compile_variant(c, pb, v);
		ck_assert_int_ge(l = tuned_launch(r->bundle, sig), 0);
		k = r->bundle->kernels[r->bundle->plan[l]->kernel];
		us = 1e3 * fake_ms(k->grid[0] * k->grid[1] * k->grid[2],
				   k->block[0] * k->block[1] * k->block[2], k->dynamic_shared_bytes);
		if (!strcmp(r->bundle->plan[l]->parts[0]->schedule, meas.config))
			ck_assert_double_eq_tol(meas.measured_us, us, 1e-6 * us);
		if (us < best_us)
			best_us = us;
		ap_compile_response_free(r);
	}
	ck_assert_double_eq_tol(meas.measured_us, best_us, 1e-6 * best_us);
	/* and the next compile builds it */
	r = compile_variant(c, pb, 0);
	ck_assert_uint_eq(r->bundle->stats->tune_measured, 1);
	ck_assert_int_ge(l = tuned_launch(r->bundle, sig), 0);
	ck_assert_str_eq(r->bundle->plan[l]->parts[0]->schedule, meas.config);
	ap_compile_response_free(r);
	/* compiled again without the cache, the kernel is searched again and a
	 * second job runs, but a refined record is not compiled again */
	{
		Apollo__CompileRequest req = APOLLO__COMPILE_REQUEST__INIT;
		Apollo__CompileOptions o = APOLLO__COMPILE_OPTIONS__INIT;

		req.source_case = APOLLO__COMPILE_REQUEST__SOURCE_GRAPH;
		req.graph = pb;
		req.target = "sm_90";
		req.output = APOLLO__OUTPUT_KIND__OUTPUT_PTX;
		o.no_cache = true;
		req.options = &o;
		r = ap_compile_run(c, &req);
		ck_assert_uint_eq(r->bundle->stats->tune_searched, 1);
		ap_compile_response_free(r);
	}
	ck_assert(ap_autotune_wait_idle(ap_compiler_autotune(c), 120000));
	{
		ap_compile_counters c2;

		ap_compiler_get_counters(c, &c2);
		ck_assert_uint_eq(c2.autotune.jobs, 2);
		ck_assert_uint_eq(c2.autotune.compiled, cc.autotune.compiled);
		ck_assert_uint_eq(c2.autotune.failed, 0);
		/* timed again, but measured before on this device: no new record */
		ck_assert_uint_eq(c2.autotune.measured, 1);
	}

	ap_compiler_free(c);
	drop_cache(cache);
	unsetenv("APOLLO_LIBCUDA");
	dlclose(h);
out_graph:
	ap_graph_pb_free(pb);
	ap_graph_free(g);
}
END_TEST

/* binary16 of v (a multiple of 1/8 below 2 in magnitude: exact) and back */
static uint16_t e2e_f16(double v)
{
	uint16_t s = v < 0 ? 0x8000 : 0;
	int e;

	v = fabs(v);
	if (v == 0)
		return s;
	e = ilogb(v);
	return s | (uint16_t)((e + 15) << 10) | (uint16_t)(ldexp(v, 10 - e) - 1024);
}

static double e2e_from_f16(uint16_t h)
{
	int e = (h >> 10) & 31, f = h & 1023;
	double v = e ? ldexp(f + 1024, e - 25) : ldexp(f, -24);

	return h & 0x8000 ? -v : v;
}

static ap_host_tensor *e2e_tensor(const char *name, int rank, int64_t d0, int64_t d1, int salt)
{
	ap_host_tensor *t = calloc(1, sizeof(*t));
	int64_t n = rank == 1 ? d0 : d0 * d1;

	t->name = strdup(name);
	t->dtype = AP_DT_F16;
	t->rank = rank;
	t->dims[0] = d0;
	t->dims[1] = d1;
	t->nbytes = (size_t)n * 2;
	t->data = malloc(t->nbytes);
	for (int64_t i = 0; i < n; i++)
		((uint16_t *)t->data)[i] = e2e_f16((double)((int)((i * 37 + salt * 11) % 13) - 6) / 8);
	return t;
}

/* From the daemon to the runtime: lib_graph's shape in float16 --
 * relu(A[M,K] B[K,N] + bias), with B a transposed weight w[N,K], with a
 * residual instead of the bias (C, beta 1), gelu_tanh(0.5 A B + R + bias)
 * (alpha, C, bias, GELU) --
 * at sm_90 with a measured record for lib=1 (the stand-in GPU's) is
 * compiled (NVRTC) into a bundle whose launch carries the call, chosen by
 * that record; the runtime runs it through the stand-in driver and the
 * stand-in cuBLASLt -- one cublasLtMatmul, no kernel launch -- and the
 * output matches a float64 reference: the daemon's leading dimensions,
 * arg indices, alpha, beta and epilogue are those of the graph, and the
 * call's 32 MiB workspace a 256-byte aligned slice of the bundle's that
 * the runtime hands to cublasLtMatmul. */
static void e2e_case(int shape)
{
	enum { M = 40, N = 24, K = 56 };
	const char *bdir = getenv("APOLLO_BUILD");
	char drv_so[300], lt_so[300], want[256];
	ap_graph *g = lib_graph(AP_DT_F16, M, N, K, shape);
	Apollo__Graph *pb = ap_graph_to_pb(g);
	ap_compiler_options co = {.threads = 1};
	ap_mgraph *m = whole_views(g);
	Apollo__CompileResponse *r;
	const Apollo__LibraryCall *lc = NULL;
	ap_host_tensor *a, *b, *bias = NULL, *res = NULL, *out;
	bool has_bias = shape == 0 || shape == 3 || shape == 5, has_res = shape == 2 || shape == 5;
	double alpha = shape == 5 ? 0.5 : 1;
	size_t *ws_bytes;
	int lc_epi;
	ap_tune_record rec;
	ap_target_info t;
	ap_compiler *c;
	ap_cache *cache;
	ap_runtime *rt;
	ap_bundle *bun;
	ap_space sp;
	ap_sched s;
	ap_error err;
	uint8_t sig[32], *buf;
	size_t len;
	void *drv, *lt;
	int *matmuls, *launches, m0, l0;
	char *d;

	if (ap_nvrtc_load(&err)) {
		AP_SKIP("nvrtc", "library_end_to_end: skipped, no NVRTC (%s)", err.msg);
		goto out_graph;
	}
	snprintf(drv_so, sizeof(drv_so), "%s/tests/libcuda-standin.so", bdir && *bdir ? bdir : "build");
	snprintf(lt_so, sizeof(lt_so), "%s/tests/libcublaslt-standin.so", bdir && *bdir ? bdir : "build");
	ck_assert_msg(access(drv_so, R_OK) == 0 && access(lt_so, R_OK) == 0, "no stand-ins at %s (make all)", drv_so);
	/* a measured record naming lib=1 for the stand-in GPU */
	ck_assert_int_eq(ap_cost_target("sm_90", &t), 0);
	ck_assert_int_eq(ap_emitter_default(B(&ap_emitter_gemm, m, &t), &sp, &s, &err), 0);
	s.v[knob_ix(&sp, "lib")] = 1;
	ck_assert_int_eq(ap_sched_valid(B(&ap_emitter_gemm, m, &t), &s), 1);
	d = ap_sched_describe(B(&ap_emitter_gemm, m, &t), &s);
	snprintf(want, sizeof(want), "%s", d);
	free(d);
	ck_assert_int_eq(ap_tune_signature(&ap_emitter_gemm, m, "sm_90", &t, 0, sig), 0);
	rec = record(want, 50.0, 1.0, "Apollo stand-in GPU|132");   /* the daemon's device id: NAME|SMS */
	cache = fresh_cache();
	ck_assert_int_eq(ap_cache_tuning_put(cache, sig, "sm_90", &rec), 0);
	c = ap_compiler_new(cache, &co);
	ck_assert_ptr_nonnull(c);
	r = compile_variant(c, pb, 0);
	for (size_t l = 0; l < r->bundle->n_plan; l++)
		if (r->bundle->plan[l]->library)
			lc = r->bundle->plan[l]->library;
	ck_assert_msg(lc != NULL, "no launch carries the library call");
	ck_assert_str_eq(lc->chosen_by, "measured tuning record");
	ck_assert_uint_eq(lc->m, M);
	ck_assert_uint_eq(lc->n, N);
	ck_assert_uint_eq(lc->k, K);
	ck_assert_int_eq(lc->epilogue, shape == 5 ? APOLLO__LIBRARY_EPILOGUE__LIB_EPI_BIAS_GELU
				       : has_bias ? APOLLO__LIBRARY_EPILOGUE__LIB_EPI_BIAS_RELU
				       : APOLLO__LIBRARY_EPILOGUE__LIB_EPI_RELU);
	ck_assert_int_eq(lc->trans_b, shape == 3);
	ck_assert_uint_eq(lc->ldb, shape == 3 ? K : N);
	ck_assert_double_eq(lc->alpha, alpha);
	lc_epi = lc->epilogue;
	ck_assert_double_eq(lc->beta, has_res ? 1 : 0);
	if (has_res) {
		ck_assert_uint_eq(lc->ldc, N);
		ck_assert_str_eq(r->bundle->buffers[r->bundle->plan[0]->args[lc->c_arg]]->name, "res");
	}
	/* cuBLAS's recommended scratch on Hopper, inside the bundle's workspace */
	ck_assert_uint_eq(lc->workspace_bytes, 32u << 20);
	ck_assert_uint_eq(lc->workspace_offset % 256, 0);
	ck_assert_uint_ge(r->bundle->workspace_bytes, lc->workspace_offset + lc->workspace_bytes);
	len = apollo__bundle__get_packed_size(r->bundle);
	buf = malloc(len);
	apollo__bundle__pack(r->bundle, buf);
	bun = ap_bundle_unpack(buf, len, &err);
	free(buf);
	ck_assert_msg(bun != NULL, "%s", err.msg);
	ap_compile_response_free(r);

	/* the runtime, through both stand-ins */
	setenv("APOLLO_LIBCUDA", drv_so, 1);
	setenv("APOLLO_LIBCUBLASLT", lt_so, 1);
	setenv("APOLLO_STANDIN_DEVICE", "h100", 1);
	drv = dlopen(drv_so, RTLD_NOW | RTLD_LOCAL);
	lt = dlopen(lt_so, RTLD_NOW | RTLD_LOCAL);
	ck_assert(drv && lt);
	matmuls = dlsym(lt, "lt_matmuls");
	launches = dlsym(drv, "fake_launches");
	ws_bytes = dlsym(lt, "lt_last_workspace_bytes");
	ck_assert(matmuls && launches && ws_bytes);
	rt = ap_runtime_new(bun, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	a = e2e_tensor("a", 2, M, K, 1);
	b = shape == 3 ? e2e_tensor("w", 2, N, K, 2) : e2e_tensor("b", 2, K, N, 2);
	ck_assert_msg(ap_runtime_bind_input(rt, 0, a, &err) == 0, "%s", err.msg);
	ck_assert_msg(ap_runtime_bind_name(rt, b->name, b, &err) == 0, "%s", err.msg);
	if (has_bias) {
		bias = e2e_tensor("bias", 1, N, 0, 3);
		ck_assert_msg(ap_runtime_bind_name(rt, "bias", bias, &err) == 0, "%s", err.msg);
	}
	if (has_res) {
		res = e2e_tensor("res", 2, M, N, 4);
		ck_assert_msg(ap_runtime_bind_name(rt, "res", res, &err) == 0, "%s", err.msg);
	}
	m0 = *matmuls;
	l0 = *launches;
	ck_assert_msg(ap_runtime_run(rt, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(*matmuls - m0, 1);
	ck_assert_int_eq(*launches - l0, 0);
	ck_assert_uint_eq(*ws_bytes, 32u << 20);   /* the runtime passed the plan's slice */
	out = ap_runtime_output(rt, 0, &err);
	ck_assert_msg(out != NULL, "%s", err.msg);
	ck_assert_int_eq(out->dtype, AP_DT_F16);
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double v = 0, got;

			for (int p = 0; p < K; p++)
				v += e2e_from_f16(((uint16_t *)a->data)[i * K + p]) *
				     e2e_from_f16(((uint16_t *)b->data)[shape == 3 ? j * K + p : p * N + j]);
			v *= alpha;
			if (has_bias)
				v += e2e_from_f16(((uint16_t *)bias->data)[j]);
			if (has_res)
				v += e2e_from_f16(((uint16_t *)res->data)[i * N + j]);
			if (shape == 5)   /* GELU, tanh approximation */
				v = 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
			else
				v = v > 0 ? v : 0;
			got = e2e_from_f16(((uint16_t *)out->data)[i * N + j]);
			ck_assert_msg(fabs(got - v) <= 1e-3 * fabs(v) + 1e-3, "out[%d][%d] = %g, want %g", i, j, got, v);
		}
	printf("check_tune: library_end_to_end shape %d: one cublasLtMatmul (stand-in), epilogue %d, "
	       "alpha %g, beta %g, %d x %d within float16 rounding of float64\n", shape, (int)lc_epi,
	       alpha, has_res ? 1.0 : 0.0, M, N);
	ap_host_tensor_free(out);
	ap_host_tensor_free(a);
	ap_host_tensor_free(b);
	ap_host_tensor_free(bias);
	ap_host_tensor_free(res);
	ap_runtime_free(rt);
	ap_bundle_free(bun);
	unsetenv("APOLLO_LIBCUDA");
	unsetenv("APOLLO_LIBCUBLASLT");
	unsetenv("APOLLO_STANDIN_DEVICE");
	dlclose(lt);
	dlclose(drv);
	ap_compiler_free(c);
	drop_cache(cache);
out_graph:
	mgraph_free(m);
	ap_graph_pb_free(pb);
	ap_graph_free(g);
}

START_TEST(library_end_to_end)
{
	e2e_case(0);
	e2e_case(3);   /* B transposed: a Linear layer's weight */
	e2e_case(2);   /* a residual: C with beta 1 */
	e2e_case(5);   /* alpha, residual, bias and GELU (tanh) */
}
END_TEST

/* ---- the same bundle whatever the load ------------------------------------------ */

/* Reads ../shared/testdata/REL (from $APOLLO_BUILD's parent or the current
 * directory); NULL when absent. */
static uint8_t *read_testdata(const char *rel, size_t *len)
{
	const char *build = getenv("APOLLO_BUILD");
	char path[4096];
	FILE *f = NULL;
	uint8_t *buf;
	long n;

	if (build && *build) {
		snprintf(path, sizeof(path), "%s/../../shared/testdata/%s", build, rel);
		f = fopen(path, "rb");
	}
	if (!f) {
		snprintf(path, sizeof(path), "../shared/testdata/%s", rel);
		f = fopen(path, "rb");
	}
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	ck_assert_ptr_nonnull(buf);
	ck_assert_int_eq(fread(buf, 1, (size_t)n, f), n);
	fclose(f);
	*len = (size_t)n;
	return buf;
}

/* What a cold compile answered: its bundle packed without its stats
 * (times) and blobs (backend output), with (`full`) and without (`sans`)
 * the kernels' digests and blob_of (which blob each kernel is in: the
 * program it was compiled in), and its stats. */
struct cold {
	uint8_t *full, *sans;
	size_t full_len, sans_len;
	Apollo__Stats st;
};

/* Packs b without stats and blobs; digests and blob_of kept or not. */
static uint8_t *pack_sans(Apollo__Bundle *b, bool digests, size_t *len)
{
	Apollo__Stats *saved = b->stats;
	uint8_t *p;

	b->stats = NULL;
	for (size_t i = 0; i < b->n_kernels; i++) {
		free(b->kernels[i]->blob.data);
		b->kernels[i]->blob.data = NULL;
		b->kernels[i]->blob.len = 0;
		if (!digests) {
			b->kernels[i]->digest.len = 0;
			b->kernels[i]->blob_of = 0;
		}
	}
	*len = apollo__bundle__get_packed_size(b);
	p = malloc(*len + 1);
	ck_assert_ptr_nonnull(p);
	apollo__bundle__pack(b, p);
	b->stats = saved;
	return p;
}

/* `tmpl` compiled cold (a fresh cache) by a compiler with `threads`
 * compile workers and a search budget of `evals` (0: the default). */
static void compile_req(const Apollo__CompileRequest *tmpl, long long evals, unsigned threads,
			struct cold *out)
{
	ap_compiler_options co = { .threads = threads, .tune_budget_evals = evals };
	Apollo__CompileRequest req = *tmpl;
	Apollo__CompileResponse *r;
	ap_cache *cache = fresh_cache();
	ap_compiler *c = ap_compiler_new(cache, &co);

	ck_assert_ptr_nonnull(c);
	req.output = strcmp(req.target, "cpu") ? APOLLO__OUTPUT_KIND__OUTPUT_PTX
					       : APOLLO__OUTPUT_KIND__OUTPUT_SO;
	r = ap_compile_run(c, &req);
	ck_assert_ptr_nonnull(r);
	ck_assert_msg(r->result_case == APOLLO__COMPILE_RESPONSE__RESULT_BUNDLE, "compile: %s",
		      r->result_case == APOLLO__COMPILE_RESPONSE__RESULT_ERROR ? r->error->message : "?");
	out->st = *r->bundle->stats;
	out->full = pack_sans(r->bundle, true, &out->full_len);
	out->sans = pack_sans(r->bundle, false, &out->sans_len);
	ap_compile_response_free(r);
	ap_compiler_free(c);
	drop_cache(cache);
}

static void cold_free(struct cold *k)
{
	free(k->full);
	free(k->sans);
}

/* One busy child per core (each also dies with this test or after 300 s):
 * their pids in kids[] (at most 256), their count returned. */
static int load_start(pid_t *kids)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int n = 0;

	for (long i = 0; i < (ncpu > 0 ? ncpu : 1) && n < 256; i++) {
		pid_t pid = fork();

		ck_assert_int_ge(pid, 0);
		if (pid == 0) {
			volatile unsigned long spin = 0;

			prctl(PR_SET_PDEATHSIG, SIGKILL);
			alarm(300);
			for (;;)
				spin++;
		}
		kids[n++] = pid;
	}
	return n;
}

/* Kills the busy children, asserting they were still spinning: the load
 * lasted the whole compile. */
static void load_stop(const pid_t *kids, int n)
{
	for (int i = 0; i < n; i++) {
		int status;

		kill(kids[i], SIGKILL);
		ck_assert_int_eq(waitpid(kids[i], &status, 0), kids[i]);
		ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	}
}

/* Two cold compiles, none cut short by the time limit, their bundles byte
 * for byte the same: with the kernels' digests (the blobs, hashed) when
 * `digests`, else kernels (named by their sources' hash), plan, schedules,
 * tuning signatures and buffers; with `alike`, searched alike too (one
 * compile worker each: with more, two kernels of one signature may both be
 * searched at once where one after the other the second takes the first's
 * record -- the same configuration either way). */
static void same_cold(const struct cold *a, const struct cold *b, bool digests, bool alike,
		      const char *what)
{
	ck_assert_uint_gt(a->st.tune_searched, 0);
	if (alike) {
		ck_assert_uint_eq(b->st.tune_searched, a->st.tune_searched);
		ck_assert_uint_eq(b->st.tune_tried, a->st.tune_tried);
	}
	ck_assert_uint_eq(a->st.tune_capped, 0);
	ck_assert_uint_eq(b->st.tune_capped, 0);
	ck_assert_uint_eq(b->st.global_bytes, a->st.global_bytes);
	if (digests) {
		ck_assert_uint_eq(b->full_len, a->full_len);
		ck_assert_msg(memcmp(b->full, a->full, a->full_len) == 0, "%s: another bundle", what);
	} else {
		ck_assert_uint_eq(b->sans_len, a->sans_len);
		ck_assert_msg(memcmp(b->sans, a->sans, a->sans_len) == 0, "%s: another bundle", what);
	}
}

/* Compiles `req` cold twice, idle and with one busy child per core, and
 * asserts the two bundles are the same (blobs aside). */
static void same_under_load(const Apollo__CompileRequest *req, long long evals)
{
	struct cold idle, busy;
	pid_t kids[256];
	int n_kids;

	compile_req(req, evals, 1, &idle);
	n_kids = load_start(kids);
	compile_req(req, evals, 1, &busy);
	load_stop(kids, n_kids);
	same_cold(&idle, &busy, false, true, "loaded");
	fprintf(stderr, "same_bundle_under_load: %s, budget %lld: %u kernels searched, %u "
		"configurations, %.1f ms idle, %.1f ms loaded\n", req->target, evals,
		idle.st.tune_searched, idle.st.tune_tried, idle.st.tune_ms, busy.st.tune_ms);
	cold_free(&idle);
	cold_free(&busy);
}

/* Issue 26, item 3: the tuner's budget is evaluations, so a loaded machine
 * builds the idle machine's bundle: at the default budget, and at a small
 * one that ends searches part-way (where a time budget would end them at
 * a point that depends on the load). */
START_TEST(same_bundle_under_load)
{
	ap_error err;
	Apollo__CompileRequest req = APOLLO__COMPILE_REQUEST__INIT;
	size_t len;
	uint8_t *model = read_testdata("models/bert_like_2l/model.onnx", &len);

	if (!model) {
		fprintf(stderr, "same_bundle_under_load: skipped, no ../shared/testdata\n");
		return;
	}
	req.source_case = APOLLO__COMPILE_REQUEST__SOURCE_ONNX_MODEL;
	req.onnx_model.data = model;
	req.onnx_model.len = len;
	req.target = ap_nvrtc_load(&err) ? "cpu" : "sm_90";
	same_under_load(&req, 0);
	same_under_load(&req, 1000);
	free(model);
}
END_TEST

/* The graph of test-data model `rel` (its folder under ../shared/testdata)
 * imported with its first test set's inputs binding its symbolic dims, as
 * apollo-client sends it; NULL when the test data is absent. */
static Apollo__Graph *testdata_graph(const char *rel)
{
	char file[300], set[300], *dir;
	uint8_t *model;
	size_t len;
	ap_host_tensor **ts = NULL;
	int n = 0;
	ap_graph *g;
	ap_error err;
	Apollo__Graph *pb;

	snprintf(file, sizeof(file), "%s/model.onnx", rel);
	if (!(model = read_testdata(file, &len)))
		return NULL;
	/* read_testdata found it under one of its two roots: the same for the set */
	snprintf(set, sizeof(set), "%s/../../shared/testdata/%s/test_data_set_0",
		 getenv("APOLLO_BUILD") ? getenv("APOLLO_BUILD") : ".", rel);
	dir = set;
	if (access(dir, R_OK)) {
		snprintf(set, sizeof(set), "../shared/testdata/%s/test_data_set_0", rel);
		dir = set;
	}
	ck_assert_msg(ap_testdata_load(dir, "input", &ts, &n, &err) == 0, "%s", err.msg);
	g = ap_onnx_import(model, len, (const ap_host_tensor *const *)ts, n, NULL, &err);
	ck_assert_msg(g != NULL, "%s: %s", rel, err.msg);
	pb = ap_graph_to_pb(g);
	ck_assert_ptr_nonnull(pb);
	ap_graph_free(g);
	ap_host_tensors_free(ts, n);
	free(model);
	return pb;
}

/* Issue 26, item 3, on a model with many tuned kernels: ppocr_mobile_v2_cls
 * (PaddleOCR's MobileNetV3 classifier, every kernel searched) at sm_90,
 * compiled cold with one compile worker, idle and with every core busy:
 * byte-identical bundles, the kernels' digests included (the same sources
 * in the same program: the same PTX); and with two workers under load the
 * same kernels, plan and schedules (its blobs are other programs: each
 * worker compiles one). */
START_TEST(same_bundle_under_load_many_kernels)
{
	ap_error err;
	Apollo__CompileRequest req = APOLLO__COMPILE_REQUEST__INIT;
	Apollo__Graph *g;
	struct cold idle, busy, busy2;
	pid_t kids[256];
	int n_kids;

	if (ap_nvrtc_load(&err)) {
		fprintf(stderr, "same_bundle_under_load_many_kernels: skipped, no NVRTC: %s\n",
			err.msg);
		return;
	}
	if (!(g = testdata_graph("models/ppocr_mobile_v2_cls"))) {
		fprintf(stderr, "same_bundle_under_load_many_kernels: skipped, no test data\n");
		return;
	}
	req.source_case = APOLLO__COMPILE_REQUEST__SOURCE_GRAPH;
	req.graph = g;
	req.target = "sm_90";
	compile_req(&req, 0, 1, &idle);
	n_kids = load_start(kids);
	compile_req(&req, 0, 1, &busy);
	compile_req(&req, 0, 2, &busy2);
	load_stop(kids, n_kids);
	ck_assert_uint_ge(idle.st.tune_searched, 40);
	same_cold(&idle, &busy, true, true, "loaded");
	same_cold(&idle, &busy2, false, false, "loaded, two workers");
	fprintf(stderr, "same_bundle_under_load_many_kernels: sm_90: %u kernels searched, %u "
		"configurations, %.1f ms idle, %.1f ms loaded; two workers loaded: %u searched, "
		"%u configurations, %.1f ms\n", idle.st.tune_searched, idle.st.tune_tried,
		idle.st.tune_ms, busy.st.tune_ms, busy2.st.tune_searched, busy2.st.tune_tried,
		busy2.st.tune_ms);
	cold_free(&idle);
	cold_free(&busy);
	cold_free(&busy2);
	ap_graph_pb_free(g);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("tune");
	TCase *tc = tcase_create("tune");
	SRunner *sr;
	int failed;

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, search_ties_keep_the_default_rule);
	tcase_add_test(tc, search_finds_known_best);
	tcase_add_test(tc, never_worse_than_default);
	tcase_add_test(tc, splitk_only_for_idle_sms);
	tcase_add_test(tc, tma_only_when_asked);
	tcase_add_test(tc, attention_long_sequences);
	tcase_add_test(tc, attention_tf32_rate);
	tcase_add_test(tc, wgmma_large_tile);
	tcase_add_test(tc, record_before_late_knob);
	tcase_add_test(tc, sched_text);
	tcase_add_test(tc, records_in_the_cache);
	tcase_add_test(tc, records_reused_by_builds);
	tcase_add_test(tc, variants_take_candidates);
	tcase_add_test(tc, signature_ignores_buffer_constants);
	tcase_add_test(tc, signature_ignores_input_order);
	tcase_add_test(tc, refined_us_reads_ptxas);
	tcase_add_test(tc, stitched_flops_count_reductions_once);
	tcase_add_test(tc, background_tuner);
	tcase_add_test(tc, budget_counts_evaluations);
	tcase_add_test(tc, same_bundle_under_load);
	tcase_add_test(tc, same_bundle_under_load_many_kernels);
	suite_add_tcase(s, tc);
	/* the library candidate (issue 25) */
	tc = tcase_create("library");
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, library_knob);
	tcase_add_test(tc, library_measured_record);
	tcase_add_test(tc, library_end_to_end);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}

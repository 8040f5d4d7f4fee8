/* hostcheck.c -- the checker of host kernels printed in the checking mode
 * (see hostcheck.h for what it finds and common/hostcheck.h for the ABI).
 *
 * Ordering: the context counts the barriers of the current block so far
 * (`be`: block and cluster barriers alike, since a cluster barrier also
 * orders the threads of each block) and the cluster barriers (`ce`).  An
 * access by thread a at counts (a_be, a_ce) is ordered before the current
 * access by thread t when a == t, or a cluster barrier came between
 * (ce > a_ce), or a and t are in the same block rank and some barrier came
 * between (be > a_be).  The host runs every thread of a phase to completion
 * before the next phase, so the counts at an access are the barriers that
 * thread has passed.  Bytes a bulk copy wrote have no generic writer:
 * they are ordered by their mbarrier instead -- readable by a thread
 * whose last wait on it saw the phase their landing counted in complete
 * (cell.bulk, bulk_phase; ctx.acq).
 *
 * Arms (roles(): warp-specialised kernels).  The threads are split into
 * arms that run as coroutines and synchronise only through mbarriers, so
 * the barrier counts order nothing between them once they run.  Each arm
 * A keeps a vector clock vc[A] (Lamport's happens-before, "Time, clocks,
 * and the ordering of events in a distributed system", 1978; vector
 * clocks: Fidge 1988, Mattern 1989; as ThreadSanitizer tracks
 * happens-before, with FastTrack's epochs, Flanagan and Freund 2009):
 * its own component vc[A][A] is A's epoch, in which its accesses happen;
 * vc[A][B] the last epoch of arm B ordered before A's present.  An
 * mbarrier is the synchronisation object (PTX ISA, "mbarrier": arrive
 * has release semantics, a try_wait that succeeds acquire semantics):
 * an arrive joins the arriving arm's clock into the barrier's clock of
 * the current phase and starts a new epoch of the arm; a phase's
 * completion joins that clock into the barrier's `done` clock; a wait
 * that succeeds joins `done` into the waiting arm's clock.  A block
 * barrier joins the clocks of the arms of one block rank (every arm for
 * a cluster barrier) and starts a new epoch of each.  A write by thread w
 * of arm W is then ordered before an access by t of arm T != W when
 * vc[T][W] reaches the write's epoch (arm_ordered), and the reads since
 * the last write, kept per arm (arm_read: the latest epoch, the barrier
 * counts, the first reader), are ordered before a write of arm T when
 * vc[T] reaches their epoch (arm_readers_ordered); a wgmma's reads of
 * shared memory count in the epoch of the wgmma.wait_group that completes
 * them (ck_wg_wait), so a release before that wait orders none of them.
 * The clocks carry one
 * component per mbarrier as well (the phases of it completed, as ctx.acq
 * counts them per thread): what an arriving thread had waited to see
 * travels with its release, so an arm that never waits on a stage's
 * `full` barrier (the producer) may still overwrite the bytes a copy
 * landed there once the consumers that waited for them released the
 * stage (bulk_seen).  Within one arm the rules above hold as without
 * arms: its threads are ordered by barriers only.  The clocks and the
 * per-cell records exist only when roles() made more than one arm.
 */
#include "hostcheck.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MESSAGES 12

typedef struct region {
	const char *base;
	unsigned long long bytes;    /* global with 0: extent unknown */
	const char *name;
	int kind, rank, param;
	size_t cell;                 /* shared: its first shadow cell */
} region;

typedef struct cell {
	uint32_t gen;                /* the block generation the rest is of */
	uint32_t w_be, w_ce, r_be, r_ce;
	int32_t writer, reader;      /* -1: none */
	int32_t pender;              /* the thread whose cp.async delivers it; -1: none */
	uint8_t multi;               /* read by several threads at (r_be, r_ce) */
	uint8_t multi_rank;          /* ... of several block ranks */
	uint16_t wg_mask;            /* warpgroups (t / 128, mod 16) whose wgmma still reads it */
	uint32_t w_fence;            /* the writer's fence.proxy.async count when it wrote */
	int8_t bulk;                 /* the mbarrier (index in ctx.mb) whose bulk copy wrote
					it last; -1: none, or a generic write since */
	uint8_t bulk_fly;            /* that copy has not landed yet */
	uint32_t bulk_phase;         /* the phase of ctx.mb[bulk] its landing counted in:
					readable after a wait that saw it complete */
} cell;

#define MAX_MBAR 16

/* An mbarrier of the current block (PTX ISA, "mbarrier"), keyed by its
 * address: phases completed so far (the current one's parity is
 * phase % 2), arrivals still expected in the current phase and per
 * phase, the tx-count (bytes of asynchronous copies expected less those
 * landed). */
typedef struct mbar {
	const char *addr;
	uint64_t phase;
	int32_t pending, expected;
	int64_t tx;
	uint64_t stuck;              /* 1 + the phase a deadlock was reported in; 0: none */
} mbar;

/* A bulk copy in flight: its cells (first; SIZE_MAX when the block's
 * shared memory is not tracked), bytes, mbarrier and issuing thread. */
typedef struct bulk_pend {
	size_t cell;
	unsigned bytes, t;
	int bar;
	const char *name;            /* the destination's array */
} bulk_pend;

typedef struct pend {
	size_t cell;                 /* first cell */
	unsigned bytes, group;
} pend;

#define MAX_ARMS 8               /* roles()'s n; the implicit arm makes 9 */

/* Arm A's reads of a cell since its last write: the latest one's epoch
 * of A and barrier counts, the first thread that read it at those counts
 * and whether others did too. */
typedef struct arm_read {
	uint32_t ep, be, ce;
	int32_t t;                   /* -1: none since the last write */
	uint8_t multi;
} arm_read;

/* The arms of a warp-specialised kernel (roles(); more than one): which
 * arm each thread is in, the clocks, and per shared cell the writer's
 * epoch and each arm's reads.  A clock has cw = n + MAX_MBAR components:
 * one per arm (its epochs) and one per mbarrier (its phases completed). */
typedef struct arms {
	unsigned n, cw;              /* arms (2..MAX_ARMS + 1); a clock's width */
	int rank[MAX_ARMS + 1];      /* the block rank all of an arm's threads are in; -1:
					several (or none) */
	bool live;                   /* the tables below are set: from the block() after
					roles() on */
	uint8_t *of;                 /* per thread: its arm */
	uint32_t *vc;                /* n x cw: each arm's clock */
	uint32_t *mclk;              /* MAX_MBAR x 2 x cw: per mbarrier the clock of its
					current phase, then `done`: of the phases completed */
	uint32_t *w_ep;              /* per cell: the epoch of its writer's arm at the write */
	arm_read *rd;                /* n_cells x n: per cell, each arm's reads since */
} arms;

typedef struct thread_state {
	unsigned committed;          /* cp.async groups committed in this block */
	pend *p;
	size_t n, cap;
	unsigned fences;             /* fence.proxy.async executed (all blocks) */
	/* a warpgroup's first thread: its wgmma groups committed in this block
	 * and the shared bytes its wgmmas read, pending until a wait covers
	 * their group */
	unsigned wg_committed;
	pend *wp;
	size_t wn, wcap;
} thread_state;

typedef struct ctx {
	const char *kernel;
	unsigned nt, bt;
	region *r;
	int nr, cap_r;
	cell *cells;
	size_t n_cells;
	uint32_t gen;
	uint32_t be, ce;
	unsigned long long block;
	thread_state *thr;
	int last;                    /* the region the last access was in (a cache) */
	unsigned long long blocks;   /* of the launch */
	bool shadow;                 /* this block's shared accesses are tracked */
	bool oom;
	unsigned long long *moved;   /* counting: per parameter, bytes loaded then bytes
					stored by this call (2 x params), added to the
					launch's counts at its end */
	struct bank_rec *bank;       /* counting: this stretch's cp.async into shared memory
					and ldmatrix rows */
	size_t n_bank, cap_bank;
	unsigned *bank_seq;          /* per kind and thread (2 x nt): its accesses in this stretch */
	mbar mb[MAX_MBAR];           /* this block's mbarriers (n_mb in use) */
	int n_mb;
	bool mb_full;                /* more than MAX_MBAR: reported once */
	bulk_pend *bp;               /* bulk copies in flight */
	size_t n_bp, cap_bp;
	uint64_t *acq;               /* nt x MAX_MBAR: the phases of each mbarrier
					completed when the thread last waited on it */
	arms *am;                    /* roles() with more than one arm; NULL: one arm */
	int sched;                   /* the coroutines' order (sched_of: SCHED_*) */
	uint64_t rng;                /* SCHED_RANDOM: xorshift64 state */
	unsigned perm[MAX_ARMS];     /* SCHED_RANDOM: this pass's order */
} ctx;

/* The order in which a warp-specialised kernel's scheduler runs its
 * coroutines in each pass (ck_order), from $APOLLO_HOSTCHECK_SCHEDULE:
 * "listed" (the default: the kernel's order -- Apollo's kernels list the
 * producer first), "reverse" (the consumers first), "random:SEED" (a
 * permutation drawn per pass, repeatable by its seed).  Findings about
 * data do not depend on it (the clocks); which bug shows first, and
 * whether a deadlock that needs one interleaving shows at all, do. */
enum { SCHED_LISTED, SCHED_REVERSE, SCHED_RANDOM };

/* One thread's cp.async into shared memory (banks_flush). */
typedef struct bank_rec {
	unsigned kind, warp, seq, lane, bytes;   /* kind: AP_HOSTCHECK_BANKS_* */
	unsigned long long word;     /* its first 4-byte word: the region's index in the
					high 32 bits, the offset / 4 in the low */
} bank_rec;

static void banks_flush(ctx *c);

/* ---- process-wide: the launch's extents and its violations ---------------------------- */

static pthread_mutex_t launch_mu = PTHREAD_MUTEX_INITIALIZER;   /* held begin .. end */
static pthread_mutex_t report_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long *g_extent;
static int g_n_extent;
static unsigned g_count;
static char g_text[MAX_MESSAGES * 320];
static size_t g_len;

/* Counting (ap_hostcheck_count): per parameter of the launch, a bit per
 * byte read and per byte written, and the bytes of every access.  The
 * kernel's worker threads update them at once: atomics. */
typedef struct counter {
	uint64_t *rbits, *wbits;
	unsigned long long loads, stores;
} counter;

static int g_counting;
static counter *g_cnt;           /* NULL: this launch is not counted */
static unsigned long long g_wave[2], g_ideal[2];   /* shared-memory wavefronts of cp.async
						       and ldmatrix (ap_hostcheck_banks_of),
						       atomics */

static void counters_free(void)
{
	for (int i = 0; g_cnt && i < g_n_extent; i++) {
		free(g_cnt[i].rbits);
		free(g_cnt[i].wbits);
	}
	free(g_cnt);
	g_cnt = NULL;
}

/* The launch's counters for g_n_extent parameters; none when counting is
 * off or memory runs out. */
static void counters_new(void)
{
	bool ok;

	if (!g_counting || g_n_extent <= 0)
		return;
	g_cnt = calloc((size_t)g_n_extent, sizeof(*g_cnt));
	ok = g_cnt != NULL;
	for (int i = 0; ok && i < g_n_extent; i++) {
		size_t words = (size_t)(g_extent[i] / 64 + 1);

		g_cnt[i].rbits = calloc(words, sizeof(uint64_t));
		g_cnt[i].wbits = calloc(words, sizeof(uint64_t));
		ok = g_cnt[i].rbits && g_cnt[i].wbits;
	}
	if (!ok)
		counters_free();
}

void ap_hostcheck_count(int on)
{
	g_counting = on;
}

static unsigned long long bits_set(const uint64_t *b, unsigned long long bytes)
{
	unsigned long long n = 0;

	for (size_t w = 0; w < (size_t)(bytes / 64 + 1); w++)
		n += (unsigned long long)__builtin_popcountll(b[w]);
	return n;
}

int ap_hostcheck_banks_of(int kind, unsigned long long *wavefronts, unsigned long long *ideal)
{
	if (kind != AP_HOSTCHECK_BANKS_COPY && kind != AP_HOSTCHECK_BANKS_LDMATRIX) {
		*wavefronts = *ideal = 0;
		return -1;
	}
	*wavefronts = __atomic_load_n(&g_wave[kind], __ATOMIC_RELAXED);
	*ideal = __atomic_load_n(&g_ideal[kind], __ATOMIC_RELAXED);
	if (!g_cnt) {
		*wavefronts = *ideal = 0;
		return -1;
	}
	return 0;
}

int ap_hostcheck_traffic_of(ap_hostcheck_traffic *out, int n)
{
	memset(out, 0, (size_t)(n > 0 ? n : 0) * sizeof(*out));
	if (!g_cnt)
		return -1;
	for (int i = 0; i < n && i < g_n_extent; i++) {
		out[i].read = bits_set(g_cnt[i].rbits, g_extent[i]);
		out[i].written = bits_set(g_cnt[i].wbits, g_extent[i]);
		out[i].loads = __atomic_load_n(&g_cnt[i].loads, __ATOMIC_RELAXED);
		out[i].stores = __atomic_load_n(&g_cnt[i].stores, __ATOMIC_RELAXED);
	}
	return 0;
}

void ap_hostcheck_begin(const unsigned long long *bytes, int n)
{
	pthread_mutex_lock(&launch_mu);
	free(g_extent);
	g_extent = n > 0 ? malloc((size_t)n * sizeof(*g_extent)) : NULL;
	g_n_extent = g_extent ? n : 0;
	if (g_extent)
		memcpy(g_extent, bytes, (size_t)n * sizeof(*g_extent));
	g_count = 0;
	g_len = 0;
	g_text[0] = '\0';
	memset(g_wave, 0, sizeof(g_wave));
	memset(g_ideal, 0, sizeof(g_ideal));
	counters_new();
}

unsigned ap_hostcheck_end(char *buf, size_t cap)
{
	unsigned n = g_count;

	if (buf && cap)
		snprintf(buf, cap, "%s", g_text);
	counters_free();
	free(g_extent);
	g_extent = NULL;
	g_n_extent = 0;
	pthread_mutex_unlock(&launch_mu);
	return n;
}

static void report(ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(ctx *c, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&report_mu);
	if (g_count++ < MAX_MESSAGES && g_len < sizeof(g_text) - 1) {
		int n = snprintf(g_text + g_len, sizeof(g_text) - g_len, "kernel %s, block %llu: ",
				 c->kernel, c->block);

		if (n > 0 && (size_t)n < sizeof(g_text) - g_len) {
			g_len += (size_t)n;
			va_start(ap, fmt);
			n = vsnprintf(g_text + g_len, sizeof(g_text) - g_len, fmt, ap);
			va_end(ap);
			if (n > 0)
				g_len += (size_t)n < sizeof(g_text) - g_len ? (size_t)n
									  : sizeof(g_text) - g_len - 1;
			if (g_len < sizeof(g_text) - 1)
				g_text[g_len++] = '\n';
			g_text[g_len] = '\0';
		}
	}
	pthread_mutex_unlock(&report_mu);
}

/* ---- arms: the vector clocks of a warp-specialised kernel (roles()) --------------------- */

static bool arms_live(const ctx *c)
{
	return c->am && c->am->live;
}

static void arms_free(arms *a)
{
	if (!a)
		return;
	free(a->of);
	free(a->vc);
	free(a->mclk);
	free(a->w_ep);
	free(a->rd);
	free(a);
}

/* Arm A's clock (cw components). */
static uint32_t *clock_of(const ctx *c, unsigned A)
{
	return c->am->vc + (size_t)A * c->am->cw;
}

/* Mbarrier b's clock: of its current phase, or (done) of the phases it
 * completed. */
static uint32_t *mbar_clock(const ctx *c, int b, bool done)
{
	return c->am->mclk + (size_t)(2 * b + (done ? 1 : 0)) * c->am->cw;
}

static void clock_join(uint32_t *to, const uint32_t *from, unsigned w)
{
	for (unsigned k = 0; k < w; k++)
		if (from[k] > to[k])
			to[k] = from[k];
}

/* The epoch thread t's arm is in: the one its accesses happen at. */
static uint32_t epoch_of(const ctx *c, unsigned t)
{
	unsigned A = c->am->of[t];

	return c->am->vc[(size_t)A * c->am->cw + A];
}

/* At a block's start: every arm in its first epoch, knowing nothing of
 * the others (epoch 0 is before everything), the mbarriers' clocks
 * empty. */
static void clocks_reset(ctx *c)
{
	arms *a = c->am;

	memset(a->vc, 0, (size_t)a->n * a->cw * sizeof(*a->vc));
	for (unsigned A = 0; A < a->n; A++)
		a->vc[(size_t)A * a->cw + A] = 1;
	memset(a->mclk, 0, (size_t)MAX_MBAR * 2 * a->cw * sizeof(*a->mclk));
}

/* The per-cell tables of the arms (n_cells x 4 bytes, and n_cells x arms
 * records of 20), at the first block() after roles().  Every cell is of
 * an older generation then, and cell_at resets a cell's records with the
 * cell, so they need no clearing between blocks. */
static void arms_tables(ctx *c)
{
	arms *a = c->am;

	if (c->n_cells) {
		if (c->n_cells > SIZE_MAX / sizeof(arm_read) / a->n) {
			c->oom = true;
			return;
		}
		a->w_ep = calloc(c->n_cells, sizeof(*a->w_ep));
		a->rd = calloc(c->n_cells * a->n, sizeof(*a->rd));
		if (!a->w_ep || !a->rd) {
			c->oom = true;
			return;
		}
	}
	a->live = true;
}

/* ---- the table's functions ------------------------------------------------------------ */

static void bulk_left(ctx *c);

/* c's schedule from $APOLLO_HOSTCHECK_SCHEDULE (the enum's comment); a
 * value it does not know is reported and the listed order kept. */
static void sched_of(ctx *c)
{
	const char *e = getenv("APOLLO_HOSTCHECK_SCHEDULE");
	char *end;
	unsigned long long seed;

	c->sched = SCHED_LISTED;
	if (!e || !*e || !strcmp(e, "listed"))
		return;
	if (!strcmp(e, "reverse")) {
		c->sched = SCHED_REVERSE;
		return;
	}
	if (!strncmp(e, "random:", 7) && e[7]) {
		errno = 0;
		seed = strtoull(e + 7, &end, 10);
		if (!*end && errno == 0) {
			c->sched = SCHED_RANDOM;
			c->rng = seed * 0x9E3779B97F4A7C15ull + 1;   /* never 0: xorshift's fixed point */
			return;
		}
	}
	report(c, "APOLLO_HOSTCHECK_SCHEDULE=%.40s: not listed, reverse or random:SEED (the listed order is used)", e);
}

static void *ck_begin(const char *kernel, unsigned threads, unsigned block_threads,
		      unsigned long long blocks)
{
	ctx *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->blocks = blocks;
	c->kernel = kernel;
	c->nt = threads ? threads : 1;
	c->bt = block_threads ? block_threads : c->nt;
	c->thr = calloc(c->nt, sizeof(*c->thr));
	c->acq = calloc((size_t)c->nt * MAX_MBAR, sizeof(*c->acq));
	if (!c->thr || !c->acq) {
		free(c->thr);
		free(c->acq);
		free(c);
		return NULL;
	}
	if (g_cnt && (!(c->moved = calloc(2 * (size_t)g_n_extent, sizeof(*c->moved))) ||
		      !(c->bank_seq = calloc(2 * (size_t)c->nt, sizeof(*c->bank_seq)))))
		c->oom = true;
	sched_of(c);
	return c;
}

static void ck_end(void *vc)
{
	ctx *c = vc;

	if (!c)
		return;
	if (g_cnt && c->bank_seq)
		banks_flush(c);
	bulk_left(c);
	if (c->oom)
		report(c, "the checker ran out of memory: accesses went unchecked");
	for (int i = 0; g_cnt && c->moved && i < g_n_extent; i++) {
		__atomic_fetch_add(&g_cnt[i].loads, c->moved[2 * i], __ATOMIC_RELAXED);
		__atomic_fetch_add(&g_cnt[i].stores, c->moved[2 * i + 1], __ATOMIC_RELAXED);
	}
	free(c->moved);
	free(c->bank);
	free(c->bank_seq);
	for (unsigned t = 0; t < c->nt; t++) {
		free(c->thr[t].p);
		free(c->thr[t].wp);
	}
	free(c->thr);
	free(c->acq);
	free(c->bp);
	free(c->cells);
	arms_free(c->am);
	free(c->r);
	free(c);
}

static void ck_region(void *vc, const void *base, unsigned long long bytes, const char *name,
		      int kind, int rank, int param)
{
	ctx *c = vc;
	region *r;

	if (!c)
		return;
	if (c->nr == c->cap_r) {
		int cap = c->cap_r ? 2 * c->cap_r : 16;
		region *nr = realloc(c->r, (size_t)cap * sizeof(*nr));

		if (!nr) {
			c->oom = true;
			return;
		}
		c->r = nr;
		c->cap_r = cap;
	}
	/* sorted by base: find() searches */
	{
		int at = c->nr;

		while (at > 0 && c->r[at - 1].base > (const char *)base)
			at--;
		memmove(&c->r[at + 1], &c->r[at], (size_t)(c->nr - at) * sizeof(*r));
		r = &c->r[at];
		c->nr++;
	}
	r->base = base;
	r->name = name;
	r->kind = kind;
	r->rank = rank;
	r->param = param;
	r->bytes = bytes;
	if (kind == AP_HCHECK_GLOBAL && param >= 0 && param < g_n_extent)
		r->bytes = g_extent[param];
	r->cell = c->n_cells;
	if (kind == AP_HCHECK_SHARED)
		c->n_cells += (size_t)bytes;
}

/* Whether block b of n has its shared accesses tracked: every block with
 * APOLLO_HOSTCHECK_ALL_BLOCKS=1, else the first two, the last two and
 * every 32nd -- the blocks of a grid run one code path but for the edges
 * (partial tiles), and tracking every shared byte of every block costs
 * 5-10x a plain run.  The kernel skips the checker in the other blocks
 * (ck_block's answer), so those run at nearly the plain speed. */
static bool shadowed(unsigned long long b, unsigned long long n)
{
	static int all = -1;

	if (all < 0) {
		const char *e = getenv("APOLLO_HOSTCHECK_ALL_BLOCKS");

		all = e && *e == '1';
	}
	return all || b < 2 || b + 2 >= n || b % 32 == 0;
}

static int ck_block(void *vc, unsigned long long block)
{
	ctx *c = vc;

	if (!c)
		return 0;
	if (g_cnt)
		banks_flush(c);
	if (!c->cells && c->n_cells && !c->oom) {
		c->cells = calloc(c->n_cells, sizeof(*c->cells));
		if (!c->cells)
			c->oom = true;
	}
	if (c->am && !c->am->live && !c->oom)
		arms_tables(c);
	bulk_left(c);
	c->gen++;
	c->be = c->ce = 0;
	c->n_mb = 0;
	c->mb_full = false;
	memset(c->acq, 0, (size_t)c->nt * MAX_MBAR * sizeof(*c->acq));
	c->block = block;
	c->shadow = shadowed(block, c->blocks);
	for (unsigned t = 0; t < c->nt; t++) {
		c->thr[t].committed = 0;
		c->thr[t].n = 0;
		c->thr[t].wg_committed = 0;
		c->thr[t].wn = 0;
	}
	if (arms_live(c))
		clocks_reset(c);
	/* counting sees every block's accesses; shared memory is tracked in
	 * the shadowed ones only (access()) */
	return c->shadow || g_cnt;
}

/* The region holding [p, p + n), or the one p starts in (then *partial):
 * the last one hit, else a binary search (regions are kept sorted by base
 * and do not overlap). */
static region *find(ctx *c, const char *p, unsigned n, bool *partial)
{
	int lo = 0, hi = c->nr - 1;
	region *r = c->last < c->nr ? &c->r[c->last] : NULL;

	*partial = false;
	if (!(r && r->bytes && p >= r->base && p < r->base + r->bytes)) {
		r = NULL;
		while (lo <= hi) {
			int mid = (lo + hi) / 2;

			if (p < c->r[mid].base) {
				hi = mid - 1;
			} else if (c->r[mid].bytes && p < c->r[mid].base + c->r[mid].bytes) {
				r = &c->r[mid];
				c->last = mid;
				break;
			} else {
				lo = mid + 1;
			}
		}
		if (!r)
			return NULL;
	}
	*partial = (unsigned long long)(p - r->base) + n > r->bytes;
	return r;
}

/* Cell i's arm records, with the cell's (a new block, or the first
 * touch): no write, no arm's read. */
static void arm_reset(ctx *c, size_t i)
{
	arms *a = c->am;

	a->w_ep[i] = 0;
	for (unsigned A = 0; A < a->n; A++)
		a->rd[i * a->n + A].t = -1;
}

static cell *cell_at(ctx *c, size_t i)
{
	cell *x = &c->cells[i];

	if (x->gen != c->gen) {
		memset(x, 0, sizeof(*x));
		x->gen = c->gen;
		x->writer = x->reader = x->pender = -1;
		x->bulk = -1;
		if (arms_live(c))
			arm_reset(c, i);
	}
	return x;
}

/* Thread t as the last writer of cell i (x), now: its barrier and fence
 * counts, no reader since; with arms, the epoch of t's arm, and no arm's
 * read since.  Every write that makes a thread the writer comes here (a
 * store, a cp.async at its wait), so that the arm records never lag the
 * cell's. */
static void set_writer(ctx *c, cell *x, size_t i, unsigned t)
{
	x->writer = (int32_t)t;
	x->w_be = c->be;
	x->w_ce = c->ce;
	x->w_fence = c->thr[t].fences;
	x->reader = -1;
	if (arms_live(c)) {
		c->am->w_ep[i] = epoch_of(c, t);
		for (unsigned A = 0; A < c->am->n; A++)
			c->am->rd[i * c->am->n + A].t = -1;
	}
}

/* A read of cell i by thread t, into its arm's record: a barrier since
 * the record's read starts a new one (the barrier orders the older reads
 * as it does the cell's own reader record), else the epoch advances and
 * a second thread makes it several. */
static void arm_read_note(ctx *c, size_t i, unsigned t)
{
	arms *a = c->am;
	arm_read *q = &a->rd[i * a->n + a->of[t]];
	uint32_t ep = epoch_of(c, t);

	if (q->t < 0 || q->be != c->be || q->ce != c->ce) {
		*q = (arm_read){ ep, c->be, c->ce, (int32_t)t, 0 };
		return;
	}
	if (ep > q->ep)
		q->ep = ep;
	if ((unsigned)q->t != t)
		q->multi = 1;
}

/* "thread T (arm A)", with its rank in a cluster, for the race reports
 * of a kernel with arms (t < nt). */
static const char *who(const ctx *c, char *buf, size_t cap, unsigned t)
{
	if (c->bt < c->nt)
		snprintf(buf, cap, "thread %u (arm %u, rank %u)", t, (unsigned)c->am->of[t], t / c->bt);
	else
		snprintf(buf, cap, "thread %u (arm %u)", t, (unsigned)c->am->of[t]);
	return buf;
}

/* Whether thread t may see the bytes of cell x a bulk copy delivered:
 * it waited on the mbarrier after the phase the landing counted in
 * completed, or (arms) its arm's clock has that phase from another
 * arm's release. */
static bool bulk_seen(const ctx *c, const cell *x, unsigned t)
{
	if (x->bulk < 0)
		return true;
	if (x->bulk_fly)
		return false;
	if (c->acq[(size_t)t * MAX_MBAR + (size_t)x->bulk] > x->bulk_phase)
		return true;
	return arms_live(c) && t < c->nt &&
	       clock_of(c, c->am->of[t])[c->am->n + (unsigned)x->bulk] > x->bulk_phase;
}

static bool ordered(const ctx *c, int a, uint32_t a_be, uint32_t a_ce, unsigned t)
{
	return a < 0 || (unsigned)a == t || c->ce > a_ce ||
	       ((unsigned)a / c->bt == t / c->bt && c->be > a_be);
}

/* With arms: whether the write of cell i by thread w (another arm's) is
 * ordered before thread t's access by the clocks: t's arm has seen the
 * epoch of w's arm the write happened in. */
static bool arm_ordered(const ctx *c, int w, size_t i, unsigned t)
{
	const arms *a = c->am;
	unsigned W, T;

	if (!arms_live(c) || w < 0 || (unsigned)w >= c->nt || t >= c->nt)
		return false;
	W = a->of[w];
	T = a->of[t];
	return W != T && a->vc[(size_t)T * a->cw + W] >= a->w_ep[i];
}

/* With arms: whether every arm's reads of byte i of r since its last
 * write are ordered before thread t's write (false after a report).  The
 * reads of t's own arm need t to be their only reader or a barrier
 * between, as without arms; another arm's reads an epoch of it t's arm
 * has seen (through an mbarrier), or a barrier between. */
static bool arm_readers_ordered(ctx *c, const region *r, size_t i, unsigned t, const char *what)
{
	const arms *a = c->am;
	size_t ci = r->cell + i;
	unsigned T = a->of[t];

	for (unsigned A = 0; A < a->n; A++) {
		const arm_read *q = &a->rd[ci * a->n + A];
		bool barrier, ok;
		char rb[64], wb[64];

		if (q->t < 0)
			continue;
		/* a block barrier orders the threads of one rank; several
		 * readers, those of the arm's rank when it has one */
		barrier = c->ce > q->ce ||
			  (c->be > q->be && (q->multi ? a->rank[A] == (int)(t / c->bt)
						      : (unsigned)q->t / c->bt == t / c->bt));
		if (A == T)
			ok = barrier || (!q->multi && (unsigned)q->t == t);
		else
			ok = barrier || a->vc[(size_t)T * a->cw + A] >= q->ep;
		if (!ok) {
			report(c, "data race on shared %s[byte %zu] (rank %d): %s%s read it after barrier %u, %s "
			       "%s it with no barrier or mbarrier between", r->name, i, r->rank,
			       who(c, rb, sizeof(rb), (unsigned)q->t), q->multi ? " (and others)" : "", q->be,
			       who(c, wb, sizeof(wb), t), what);
			return false;
		}
	}
	return true;
}

/* The shared region of an access, after its bounds and alignment checks;
 * NULL when nothing more is to check (global memory, unknown memory, or a
 * violation already reported). */
static region *access(ctx *c, const void *vp, unsigned n, unsigned t, unsigned align,
		      const char *what)
{
	const char *p = vp;
	bool partial;
	region *r;

	if (!c || c->oom)
		return NULL;
	if (align > 1 && (uintptr_t)p % align) {
		report(c, "thread %u: %s of %u bytes at %p is not %u-byte aligned", t, what, n,
		       (const void *)p, align);
		return NULL;
	}
	r = find(c, p, n, &partial);
	if (!r) {
		/* a pointer just past a known region is an overrun of it */
		for (int i = 0; i < c->nr; i++)
			if (c->r[i].bytes && p >= c->r[i].base &&
			    p < c->r[i].base + c->r[i].bytes + 4096 && p >= c->r[i].base + c->r[i].bytes) {
				report(c, "thread %u: %s of %u bytes at byte %lld of %s %s (%llu bytes): out "
				       "of bounds", t, what, n, (long long)(p - c->r[i].base),
				       c->r[i].kind == AP_HCHECK_SHARED ? "shared array" : "buffer",
				       c->r[i].name, c->r[i].bytes);
				return NULL;
			}
		return NULL;
	}
	if (partial) {
		report(c, "thread %u: %s of %u bytes at byte %lld of %s %s (%llu bytes): out of "
		       "bounds", t, what, n, (long long)(p - r->base),
		       r->kind == AP_HCHECK_SHARED ? "shared array" : "buffer", r->name, r->bytes);
		return NULL;
	}
	if (r->kind != AP_HCHECK_SHARED || !c->cells || !c->shadow)
		return NULL;
	if (arms_live(c) && t >= c->nt) {   /* its arm is unknown */
		report(c, "thread %u: %s of shared %s: the block has %u threads", t, what, r->name, c->nt);
		return NULL;
	}
	return r;
}

/* Counting: n bytes at p accessed (written or read), when they lie in a
 * global parameter's buffer. */
static void count(ctx *c, const void *p, unsigned n, bool write)
{
	bool partial;
	region *r = c ? find(c, p, n, &partial) : NULL;
	counter *k;
	uint64_t *bits;
	size_t off, take;

	if (!r || partial || r->kind != AP_HCHECK_GLOBAL || r->param < 0 || r->param >= g_n_extent)
		return;
	k = &g_cnt[r->param];
	bits = write ? k->wbits : k->rbits;
	off = (size_t)((const char *)p - r->base);
	if (c->moved)
		c->moved[2 * r->param + write] += n;
	for (size_t i = off; i < off + n; i += take) {   /* a word's bits at once */
		size_t b = i % 64;
		uint64_t mask;

		take = off + n - i < 64 - b ? off + n - i : 64 - b;
		mask = (take == 64 ? ~(uint64_t)0 : ((uint64_t)1 << take) - 1) << b;
		if ((__atomic_load_n(&bits[i / 64], __ATOMIC_RELAXED) & mask) != mask)
			__atomic_fetch_or(&bits[i / 64], mask, __ATOMIC_RELAXED);
	}
}

static const void *ck_rd(void *vc, const void *p, unsigned n, unsigned t, unsigned align)
{
	ctx *c = vc;
	region *r;
	size_t off;

	if (g_cnt)
		count(c, p, n, false);
	r = access(c, p, n, t, align, "read");
	if (!r)
		return p;
	off = (size_t)((const char *)p - r->base);
	for (unsigned i = 0; i < n; i++) {
		size_t ci = r->cell + off + i;
		cell *x = &c->cells[ci];

		if (x->gen != c->gen) {   /* untouched in this block: only this read */
			x->gen = c->gen;
			x->writer = x->pender = -1;
			x->reader = (int32_t)t;
			x->r_be = c->be;
			x->r_ce = c->ce;
			x->multi = x->multi_rank = 0;
			x->wg_mask = 0;
			x->w_fence = 0;
			x->bulk = -1;
			x->bulk_fly = 0;
			if (arms_live(c)) {
				arm_reset(c, ci);
				arm_read_note(c, ci, t);
			}
			continue;
		}
		if (x->reader == (int32_t)t && x->r_be == c->be && x->r_ce == c->ce && x->pender < 0 &&
		    x->bulk < 0) {
			/* read by this thread since the last barrier: seen; its
			 * arm may be in a later epoch (an arrive since) */
			if (arms_live(c))
				arm_read_note(c, ci, t);
			continue;
		}
		if (x->bulk_fly) {
			report(c, "thread %u reads shared %s[byte %zu] (rank %d) before the bulk copy or TMA load on "
			       "mbarrier %d has delivered it (no wait on the phase it completes)", t, r->name, off + i,
			       r->rank, x->bulk);
			return p;
		}
		if (!bulk_seen(c, x, t)) {
			report(c, "thread %u reads shared %s[byte %zu] (rank %d), which a bulk copy or TMA load on "
			       "mbarrier %d delivered in phase %u, without a wait that saw that phase complete", t, r->name,
			       off + i, r->rank, x->bulk, x->bulk_phase);
			return p;
		}
		if (x->pender >= 0) {
			report(c, "thread %u (rank %u) reads shared %s[byte %zu] (rank %d) before the "
			       "cp.async of thread %d has delivered it (no cp.async.wait_group of that "
			       "thread covers its group)", t, t / c->bt, r->name, off + i, r->rank,
			       x->pender);
			return p;
		}
		if (!ordered(c, x->writer, x->w_be, x->w_ce, t) && !arm_ordered(c, x->writer, ci, t)) {
			char wb[64], rb[64];

			if (arms_live(c) && (unsigned)x->writer < c->nt)
				report(c, "data race on shared %s[byte %zu] (rank %d): %s wrote it after barrier "
				       "%u, %s reads it with no barrier or mbarrier between", r->name, off + i,
				       r->rank, who(c, wb, sizeof(wb), (unsigned)x->writer), x->w_be,
				       who(c, rb, sizeof(rb), t));
			else
				report(c, "data race on shared %s[byte %zu] (rank %d): thread %d (rank %u) wrote "
				       "it after barrier %u, thread %u (rank %u) reads it with no %s barrier "
				       "between", r->name, off + i, r->rank, x->writer, (unsigned)x->writer / c->bt,
				       x->w_be, t, t / c->bt,
				       (unsigned)x->writer / c->bt == t / c->bt ? "block" : "cluster");
			return p;
		}
		if (x->reader < 0 || x->r_be != c->be || x->r_ce != c->ce) {
			x->reader = (int32_t)t;
			x->r_be = c->be;
			x->r_ce = c->ce;
			x->multi = x->multi_rank = 0;
		} else if ((unsigned)x->reader != t) {
			x->multi = 1;
			if ((unsigned)x->reader / c->bt != t / c->bt)
				x->multi_rank = 1;
		}
		if (arms_live(c))
			arm_read_note(c, ci, t);
	}
	return p;
}

/* A write by t to byte i of r: the race and pending checks (false after a
 * report), then t as its writer. */
static bool write_cell(ctx *c, region *r, size_t i, unsigned t, const char *what)
{
	size_t ci = r->cell + i;
	cell *x = cell_at(c, ci);
	bool readers_ordered;

	if (x->bulk_fly) {
		report(c, "thread %u %s shared %s[byte %zu] (rank %d) while a bulk copy on mbarrier %d is "
		       "still delivering it", t, what, r->name, i, r->rank, x->bulk);
		return false;
	}
	if (!bulk_seen(c, x, t)) {
		report(c, "thread %u %s shared %s[byte %zu] (rank %d), which a bulk copy on mbarrier %d "
		       "delivered, without a wait on the phase that covers it", t, what, r->name, i, r->rank,
		       x->bulk);
		return false;
	}
	if (x->pender >= 0) {
		report(c, "thread %u %s shared %s[byte %zu] (rank %d) while the cp.async of thread %d "
		       "is still delivering it", t, what, r->name, i, r->rank, x->pender);
		return false;
	}
	if (x->wg_mask) {
		report(c, "thread %u %s shared %s[byte %zu] (rank %d) while a wgmma of warpgroup %d still "
		       "reads it (no wgmma.wait_group of that warpgroup covers its group)", t, what, r->name, i,
		       r->rank, __builtin_ctz(x->wg_mask));
		return false;
	}
	if (!ordered(c, x->writer, x->w_be, x->w_ce, t) && !arm_ordered(c, x->writer, ci, t)) {
		char wb[64], tb[64];

		if (arms_live(c) && (unsigned)x->writer < c->nt)
			report(c, "data race on shared %s[byte %zu] (rank %d): %s wrote it after barrier %u, %s "
			       "%s it with no barrier or mbarrier between", r->name, i, r->rank,
			       who(c, wb, sizeof(wb), (unsigned)x->writer), x->w_be, who(c, tb, sizeof(tb), t),
			       what);
		else
			report(c, "data race on shared %s[byte %zu] (rank %d): thread %d wrote it after barrier "
			       "%u, thread %u %s it with no barrier between", r->name, i, r->rank, x->writer,
			       x->w_be, t, what);
		return false;
	}
	if (arms_live(c)) {
		if (!arm_readers_ordered(c, r, i, t, what))
			return false;
	} else {
		readers_ordered = x->reader < 0 || c->ce > x->r_ce ||
				  (!x->multi && (unsigned)x->reader == t) ||
				  (!x->multi_rank && (unsigned)x->reader / c->bt == t / c->bt && c->be > x->r_be);
		if (!readers_ordered) {
			report(c, "data race on shared %s[byte %zu] (rank %d): thread %d%s read it after barrier "
			       "%u, thread %u %s it with no barrier between", r->name, i, r->rank, x->reader,
			       x->multi ? " (and others)" : "", x->r_be, t, what);
			return false;
		}
	}
	set_writer(c, x, ci, t);
	x->bulk = -1;
	return true;
}

static void *ck_wr(void *vc, void *p, unsigned n, unsigned t, unsigned align)
{
	ctx *c = vc;
	region *r;
	size_t off;

	if (g_cnt)
		count(c, p, n, true);
	r = access(c, p, n, t, align, "write");
	if (!r)
		return p;
	off = (size_t)((char *)p - r->base);
	for (unsigned i = 0; i < n; i++)
		if (!write_cell(c, r, off + i, t, "writes"))
			break;
	return p;
}

/* ---- counting: shared-memory bank conflicts of cp.async (ap_hostcheck_banks_of) ---------- */

static int bank_cmp(const void *pa, const void *pb)
{
	const bank_rec *a = pa, *b = pb;

	if (a->kind != b->kind)
		return a->kind < b->kind ? -1 : 1;
	if (a->warp != b->warp)
		return a->warp < b->warp ? -1 : 1;
	if (a->seq != b->seq)
		return a->seq < b->seq ? -1 : 1;
	return a->lane < b->lane ? -1 : a->lane > b->lane;
}

/* The wavefronts one part of a warp's instruction takes, recs r[0, n)
 * (at most 32 distinct words: 8 lanes of 16 bytes, 16 of 8 or 32 of 4
 * or fewer), and those it needs (hostcheck.h's model). */
static void part_wavefronts(const bank_rec *r, size_t n, unsigned long long *wave,
			    unsigned long long *ideal)
{
	unsigned long long words[64];
	unsigned per_bank[32] = {0}, most = 0;
	size_t nw = 0;

	for (size_t i = 0; i < n; i++)
		for (unsigned w = 0; w < (r[i].bytes + 3) / 4; w++) {
			unsigned long long x = r[i].word + w;
			size_t j = 0;

			while (j < nw && words[j] != x)
				j++;
			if (j < nw || nw == sizeof(words) / sizeof(words[0]))
				continue;
			words[nw++] = x;
			if (++per_bank[(x & 0xffffffffull) % 32] > most)
				most = per_bank[(x & 0xffffffffull) % 32];
		}
	*wave += most;
	*ideal += (nw + 31) / 32;
}

/* Adds the stretch's copies (since the last barrier or block start) to
 * the launch's wavefronts: grouped per warp and copy number, each group
 * split into the parts of a warp the hardware serves at once. */
static void banks_flush(ctx *c)
{
	unsigned long long wave[2] = {0, 0}, ideal[2] = {0, 0};

	if (!c->n_bank)
		return;
	qsort(c->bank, c->n_bank, sizeof(*c->bank), bank_cmp);
	for (size_t i = 0, j; i < c->n_bank; i = j) {
		unsigned part = c->bank[i].bytes >= 16 ? 8 : c->bank[i].bytes == 8 ? 16 : 32;

		for (j = i; j < c->n_bank && c->bank[j].kind == c->bank[i].kind && c->bank[j].warp == c->bank[i].warp &&
			    c->bank[j].seq == c->bank[i].seq;
		     j++)
			;
		for (size_t a = i, b; a < j; a = b) {
			for (b = a; b < j && c->bank[b].lane / part == c->bank[a].lane / part; b++)
				;
			part_wavefronts(c->bank + a, b - a, &wave[c->bank[i].kind], &ideal[c->bank[i].kind]);
		}
	}
	for (int k = 0; k < 2; k++) {
		__atomic_fetch_add(&g_wave[k], wave[k], __ATOMIC_RELAXED);
		__atomic_fetch_add(&g_ideal[k], ideal[k], __ATOMIC_RELAXED);
	}
	c->n_bank = 0;
	memset(c->bank_seq, 0, 2 * (size_t)c->nt * sizeof(*c->bank_seq));
}

/* Counting: thread t's access of `kind` (AP_HOSTCHECK_BANKS_*), n bytes
 * at dst, when dst is shared. */
static void bank_note(ctx *c, unsigned kind, const void *dst, unsigned n, unsigned t)
{
	bool partial;
	region *r = find(c, dst, n, &partial);

	if (!r || partial || r->kind != AP_HCHECK_SHARED || !c->bank_seq)
		return;
	if (c->n_bank == c->cap_bank) {
		size_t cap = c->cap_bank ? 2 * c->cap_bank : 256;
		bank_rec *nb = realloc(c->bank, cap * sizeof(*nb));

		if (!nb) {
			c->oom = true;
			return;
		}
		c->bank = nb;
		c->cap_bank = cap;
	}
	c->bank[c->n_bank++] = (bank_rec){kind, t / 32, c->bank_seq[kind * c->nt + t]++, t % 32, n,
					  ((unsigned long long)(r - c->r) << 32) |
						  (unsigned long long)(((const char *)dst - r->base) / 4)};
}

static void ck_async(void *vc, void *dst, const void *src, unsigned n, unsigned t, int pred)
{
	ctx *c = vc;
	region *r;
	thread_state *ts;
	size_t off;

	if (!c || t >= c->nt)
		return;
	if (pred && g_cnt)
		count(c, src, n, false);
	if (g_cnt)
		bank_note(c, AP_HOSTCHECK_BANKS_COPY, dst, n, t);
	if (pred)
		access(c, src, n, t, n, "cp.async source read");
	r = access(c, dst, n, t, n, "cp.async");
	if (!r)
		return;
	off = (size_t)((char *)dst - r->base);
	for (unsigned i = 0; i < n; i++)
		if (!write_cell(c, r, off + i, t, "copies into (cp.async)"))
			return;
	ts = &c->thr[t];
	if (ts->n == ts->cap) {
		size_t cap = ts->cap ? 2 * ts->cap : 16;
		pend *np = realloc(ts->p, cap * sizeof(*np));

		if (!np) {
			c->oom = true;
			return;
		}
		ts->p = np;
		ts->cap = cap;
	}
	ts->p[ts->n++] = (pend){ r->cell + off, n, ts->committed };
	for (unsigned i = 0; i < n; i++)
		c->cells[r->cell + off + i].pender = (int32_t)t;
}

static void ck_commit(void *vc, unsigned t)
{
	ctx *c = vc;

	if (c && t < c->nt)
		c->thr[t].committed++;
}

/* cp.async.wait_group N: every group of thread t but the N most recent
 * committed has arrived; copies not yet committed stay pending. */
static void ck_wait(void *vc, unsigned t, int pending)
{
	ctx *c = vc;
	thread_state *ts;
	size_t keep = 0;

	if (!c || t >= c->nt)
		return;
	ts = &c->thr[t];
	for (size_t i = 0; i < ts->n; i++) {
		pend *q = &ts->p[i];

		if ((long long)q->group >= (long long)ts->committed - pending) {
			ts->p[keep++] = *q;
			continue;
		}
		for (unsigned j = 0; j < q->bytes; j++) {
			cell *x = cell_at(c, q->cell + j);

			x->pender = -1;
			set_writer(c, x, q->cell + j, t);   /* lands now: t writes it */
		}
	}
	ts->n = keep;
}

/* A barrier with arms: the clocks of the arms it orders are joined --
 * every arm of one block rank for a block barrier (an arm spreading over
 * ranks is ordered with the others by the barrier counts alone, as
 * without arms), every arm for a cluster barrier -- and each arm starts
 * a new epoch, so that what it does after the barrier is not taken for
 * what it did before. */
static void arms_barrier(ctx *c, int cluster)
{
	arms *a = c->am;
	uint32_t m[MAX_ARMS + 1 + MAX_MBAR];
	bool done[MAX_ARMS + 1] = { false };

	for (unsigned A = 0; A < a->n; A++) {
		if (done[A] || (!cluster && a->rank[A] < 0))
			continue;
		memset(m, 0, sizeof(m));
		for (unsigned B = A; B < a->n; B++)
			if (cluster || a->rank[B] == a->rank[A])
				clock_join(m, clock_of(c, B), a->cw);
		for (unsigned B = A; B < a->n; B++)
			if (cluster || a->rank[B] == a->rank[A]) {
				memcpy(clock_of(c, B), m, a->cw * sizeof(*m));
				done[B] = true;
			}
	}
	for (unsigned A = 0; A < a->n; A++)
		clock_of(c, A)[A]++;
}

static void ck_barrier(void *vc, int cluster)
{
	ctx *c = vc;

	if (!c)
		return;
	if (g_cnt)
		banks_flush(c);
	c->be++;
	if (cluster)
		c->ce++;
	if (arms_live(c))
		arms_barrier(c, cluster);
}

/* ---- wgmma (sm_90a): the async proxy ---------------------------------------------------- */

static void ck_fence_async(void *vc, unsigned t)
{
	ctx *c = vc;

	if (c && t < c->nt)
		c->thr[t].fences++;
}

/* A pending range of warpgroup leader L's wgmma reads, in its current
 * group; false when out of memory (reported at the end). */
static bool wg_pend(ctx *c, unsigned L, size_t first, unsigned n)
{
	thread_state *ts = &c->thr[L];

	if (ts->wn == ts->wcap) {
		size_t cap = ts->wcap ? 2 * ts->wcap : 64;
		pend *np = realloc(ts->wp, cap * sizeof(*np));

		if (!np) {
			c->oom = true;
			return false;
		}
		ts->wp = np;
		ts->wcap = cap;
	}
	ts->wp[ts->wn++] = (pend){ first, n, ts->wg_committed };
	return true;
}

/* n bytes at p read by a wgmma of thread t's warpgroup: an ordinary read
 * (a race with their writer, a cp.async not delivered), then the async
 * proxy's rule -- the writer fenced (fence.proxy.async) after writing --
 * and the bytes marked read by the warpgroup until its wait covers the
 * group (a write before then is reported by write_cell). */
static const void *ck_wg_rd(void *vc, const void *p, unsigned n, unsigned t)
{
	ctx *c = vc;
	region *r;
	size_t off;
	unsigned before = g_count, L = t & ~127u;

	ck_rd(vc, p, n, t, n);
	if (!c || t >= c->nt || g_count != before)
		return p;
	r = access(c, p, n, t, 1, "wgmma read");
	if (!r)
		return p;
	off = (size_t)((const char *)p - r->base);
	for (unsigned i = 0; i < n; i++) {
		cell *x = cell_at(c, r->cell + off + i);

		if (x->writer >= 0 && (unsigned)x->writer < c->nt && c->thr[x->writer].fences == x->w_fence) {
			report(c, "wgmma of thread %u's warpgroup reads shared %s[byte %zu] (rank %d), which thread "
			       "%d wrote with no fence.proxy.async after it: the async proxy may not see the write",
			       t, r->name, off + i, r->rank, x->writer);
			return p;
		}
		x->wg_mask |= (uint16_t)(1u << ((t / 128) % 16));
	}
	wg_pend(c, L, r->cell + off, n);
	return p;
}

static void ck_wg_commit(void *vc, unsigned t)
{
	ctx *c = vc;

	if (c && t < c->nt && t % 128 == 0)
		c->thr[t].wg_committed++;
}

/* wgmma.wait_group N of warpgroup t / 128: every group but the N most
 * recent committed is complete, its shared reads done. */
static void ck_wg_wait(void *vc, unsigned t, int pending)
{
	ctx *c = vc;
	thread_state *ts;
	size_t keep = 0;

	if (!c || t >= c->nt || t % 128)
		return;
	ts = &c->thr[t];
	for (size_t i = 0; i < ts->wn; i++) {
		pend *q = &ts->wp[i];

		if ((long long)q->group >= (long long)ts->wg_committed - pending) {
			ts->wp[keep++] = *q;
			continue;
		}
		for (unsigned j = 0; j < q->bytes; j++) {
			cell_at(c, q->cell + j)->wg_mask &= (uint16_t)~(1u << ((t / 128) % 16));
			/* with arms: the async proxy's reads complete by this
			 * wait, so they count in the warpgroup's epoch now -- a
			 * release (arrive) made before the wait does not order
			 * them before another arm's refill */
			if (arms_live(c) && c->am->rd)
				arm_read_note(c, q->cell + j, t);
		}
	}
	ts->wn = keep;
}

/* ldmatrix's row of lane t: a 16-byte read like any other, noted for the
 * bank count as part of the warp's ldmatrix. */
static const void *ck_lm_rd(void *vc, const void *p, unsigned t)
{
	ctx *c = vc;

	if (g_cnt && c && t < c->nt)
		bank_note(c, AP_HOSTCHECK_BANKS_LDMATRIX, p, 16, t);
	return ck_rd(vc, p, 16, t, 16);
}

/* ---- mbarriers and bulk copies (sm_90) ------------------------------------------------- */

#define NO_THREAD (~0u)         /* mbar_find's t for an op of no one thread */

/* The mbarrier at addr (its index in c->mb), created by an init; -1
 * after a report (never initialised in this block, or too many). */
static int mbar_find(ctx *c, const void *addr, unsigned t, bool init, const char *what)
{
	for (int i = 0; i < c->n_mb; i++)
		if (c->mb[i].addr == addr)
			return i;
	if (!init) {
		if (t == NO_THREAD)
			report(c, "%s on the mbarrier at %p, which no mbarrier.init of this block initialised",
			       what, addr);
		else
			report(c, "thread %u: %s on the mbarrier at %p, which no mbarrier.init of this block "
			       "initialised", t, what, addr);
		return -1;
	}
	if (c->n_mb == MAX_MBAR) {
		if (!c->mb_full)
			report(c, "more than %d mbarriers in a block: the rest go unchecked", MAX_MBAR);
		c->mb_full = true;
		return -1;
	}
	c->mb[c->n_mb] = (mbar){ .addr = addr };
	return c->n_mb++;
}

/* The completion test of mbarrier b: no arrival and no byte pending
 * ends the phase.  With arms, the phase's clock joins `done` (the phases
 * completed: an arrival of an earlier phase is ordered before this
 * completion too, the barrier's updates being one sequence), and done
 * counts the phase in b's own component. */
static void mbar_complete(ctx *c, int b)
{
	mbar *m = &c->mb[b];

	if (m->pending == 0 && m->tx == 0) {
		m->phase++;
		m->pending = m->expected;
		if (arms_live(c)) {
			uint32_t *cur = mbar_clock(c, b, false), *done = mbar_clock(c, b, true);

			clock_join(done, cur, c->am->cw);
			memset(cur, 0, c->am->cw * sizeof(*cur));
			done[c->am->n + (unsigned)b] = (uint32_t)m->phase;
		}
	}
}

static bool bulk_on(const ctx *c, int b)
{
	for (size_t i = 0; i < c->n_bp; i++)
		if (c->bp[i].bar == b)
			return true;
	return false;
}

static void ck_mbar_init(void *vc, void *bar, unsigned count, unsigned t)
{
	ctx *c = vc;
	int b;

	if (!c || t >= c->nt)
		return;
	if (count < 1 || count >= 1u << 20) {
		report(c, "thread %u: mbarrier.init with %u expected arrivals (1 to 2^20 - 1)", t, count);
		return;
	}
	if ((b = mbar_find(c, bar, t, true, "mbarrier.init")) < 0)
		return;
	if (c->mb[b].expected && (c->mb[b].pending != c->mb[b].expected || c->mb[b].tx || bulk_on(c, b)))
		report(c, "thread %u: mbarrier.init of mbarrier %d while its phase %llu has %d arrival(s), "
		       "%lld tx byte(s) or a bulk copy pending", t, b, (unsigned long long)c->mb[b].phase,
		       c->mb[b].expected - c->mb[b].pending, (long long)c->mb[b].tx);
	c->mb[b] = (mbar){ .addr = bar, .pending = (int32_t)count, .expected = (int32_t)count };
	for (unsigned u = 0; u < c->nt; u++)
		c->acq[(size_t)u * MAX_MBAR + (size_t)b] = 0;
	if (arms_live(c)) {
		/* phase 0 again: no clock may hold a phase of the old one */
		arms *a = c->am;

		memset(mbar_clock(c, b, false), 0, 2 * (size_t)a->cw * sizeof(uint32_t));
		for (unsigned A = 0; A < a->n; A++)
			clock_of(c, A)[a->n + (unsigned)b] = 0;
		for (int k = 0; k < MAX_MBAR; k++) {
			mbar_clock(c, k, false)[a->n + (unsigned)b] = 0;
			mbar_clock(c, k, true)[a->n + (unsigned)b] = 0;
		}
	}
}

static void ck_mbar_arrive(void *vc, void *bar, unsigned tx, unsigned t)
{
	ctx *c = vc;
	mbar *m;
	int b;

	if (!c || t >= c->nt || (b = mbar_find(c, bar, t, false, "mbarrier.arrive")) < 0)
		return;
	m = &c->mb[b];
	if (m->tx + (int64_t)tx >= 1 << 20) {
		report(c, "thread %u: mbarrier.arrive.expect_tx of %u bytes on mbarrier %d takes its tx-count "
		       "to %lld (at most 2^20 - 1)", t, tx, b, (long long)(m->tx + (int64_t)tx));
		return;
	}
	m->tx += (int64_t)tx;
	if (--m->pending < 0) {
		report(c, "thread %u: mbarrier.arrive on mbarrier %d: more arrivals in phase %llu than the %d "
		       "it expects", t, b, (unsigned long long)m->phase, m->expected);
		m->pending = 0;
		return;
	}
	if (arms_live(c)) {
		/* the release: t's arm's clock, and the phases t waited to
		 * see complete, into this phase's clock; the arm's later
		 * accesses are after it */
		arms *a = c->am;
		uint32_t *cur = mbar_clock(c, b, false), *v = clock_of(c, a->of[t]);

		clock_join(cur, v, a->cw);
		for (unsigned k = 0; k < MAX_MBAR; k++) {
			uint64_t q = c->acq[(size_t)t * MAX_MBAR + k];

			if (q > cur[a->n + k])
				cur[a->n + k] = (uint32_t)q;
		}
		v[a->of[t]]++;
	}
	mbar_complete(c, b);
}

/* Bulk copy q lands (no longer in c->bp): its bytes stop being in
 * flight and count in the phase current now, its tx bytes count down
 * that phase's tx-count, and the completion test runs.  Bytes of an
 * untracked block (cell SIZE_MAX) have no cells; the barrier counts all
 * the same. */
static void bulk_land(ctx *c, const bulk_pend *q)
{
	mbar *m = &c->mb[q->bar];

	for (unsigned j = 0; q->cell != SIZE_MAX && c->cells && j < q->bytes; j++) {
		cell *x = cell_at(c, q->cell + j);

		x->bulk_fly = 0;
		x->bulk_phase = (uint32_t)m->phase;
	}
	m->tx -= (int64_t)q->bytes;
	mbar_complete(c, q->bar);
}

/* The bulk copies on mbarrier b land, oldest first, each counting down
 * the tx-count of the phase current at its landing. */
static void bulk_deliver(ctx *c, int b)
{
	size_t keep = 0, n = c->n_bp;

	for (size_t i = 0; i < n; i++) {
		bulk_pend q = c->bp[i];

		if (q.bar != b) {
			c->bp[keep++] = q;
			continue;
		}
		bulk_land(c, &q);
	}
	c->n_bp = keep;
}

/* A wait between phases (every thread of the block calls it).  Copies
 * land as late as they may: only when the phase of the parity asked for
 * is not complete yet (a wait that returns at once, e.g. for the wrong
 * parity, leaves them in flight, so the reads after it are reported);
 * then the phase must be complete -- nothing else can complete it now. */
static void ck_mbar_wait(void *vc, void *bar, unsigned parity, unsigned t)
{
	ctx *c = vc;
	mbar *m;
	uint64_t *a;
	int b;

	if (!c || t >= c->nt || (b = mbar_find(c, bar, t, false, "mbarrier wait")) < 0)
		return;
	m = &c->mb[b];
	if ((m->phase & 1u) == (parity & 1u))
		bulk_deliver(c, b);
	if ((m->phase & 1u) == (parity & 1u)) {
		if (m->stuck != m->phase + 1)
			report(c, "deadlock: thread %u waits on mbarrier %d for the phase of parity %u, but phase "
			       "%llu still expects %d arrival(s) of %d and %lld tx byte(s), and nothing else can "
			       "complete it", t, b, parity & 1u, (unsigned long long)m->phase, m->pending,
			       m->expected, (long long)m->tx);
		m->stuck = m->phase + 1;
		return;
	}
	a = &c->acq[(size_t)t * MAX_MBAR + (size_t)b];
	if (m->phase >= *a + 2)
		report(c, "thread %u waits on mbarrier %d (parity %u) after %llu phases completed since its "
		       "last wait: the parity cannot tell them apart", t, b, parity & 1u,
		       (unsigned long long)(m->phase - *a));
	if (m->phase > *a)
		*a = m->phase;
	if (arms_live(c)) {
		/* the acquire: the completed phases' clock into t's arm's
		 * (in phase 0 nothing completed: an empty clock).  b's own
		 * component stays out: a thread sees b's copies by its own
		 * wait (acq), as without arms; the arm learns of b's phases
		 * only from another arm's release. */
		arms *a2 = c->am;
		uint32_t *v = clock_of(c, a2->of[t]);
		const uint32_t *done = mbar_clock(c, b, true);

		for (unsigned k = 0; k < a2->cw; k++)
			if (k != a2->n + (unsigned)b && done[k] > v[k])
				v[k] = done[k];
	}
}

/* n bytes at dst written by an asynchronous copy of thread t (what:
 * "bulk copy", "TMA load", dst aligned to `align`), landing on the
 * mbarrier at bar: the write checks, then the bytes in flight. */
static void async_land(ctx *c, void *dst, unsigned n, void *bar, unsigned t, unsigned align, const char *what)
{
	region *r;
	size_t off;
	int b;

	if ((b = mbar_find(c, bar, t, false, what)) < 0)
		return;
	r = access(c, dst, n, t, align, what);
	off = r ? (size_t)((char *)dst - r->base) : 0;
	for (unsigned i = 0; r && i < n; i++) {
		cell *x;

		if (!write_cell(c, r, off + i, t, "copies into (an asynchronous copy)")) {
			r = NULL;   /* reported; its bytes still count on the barrier */
			break;
		}
		x = &c->cells[r->cell + off + i];
		x->writer = -1;   /* the async proxy's: ordered by the mbarrier */
		x->bulk = (int8_t)b;
		x->bulk_fly = 1;
	}
	if (c->n_bp == c->cap_bp) {
		size_t cap = c->cap_bp ? 2 * c->cap_bp : 16;
		bulk_pend *np = realloc(c->bp, cap * sizeof(*np));

		if (!np) {
			/* unchecked from now on (access()), but the barrier
			 * must still complete for the schedule (mbar_ready):
			 * the copy lands at once */
			bulk_pend q = { SIZE_MAX, n, t, b, "?" };

			c->oom = true;
			bulk_land(c, &q);
			return;
		}
		c->bp = np;
		c->cap_bp = cap;
	}
	c->bp[c->n_bp++] = (bulk_pend){ r ? r->cell + off : SIZE_MAX, n, t, b, r ? r->name : "?" };
}

static void ck_bulk(void *vc, void *dst, const void *src, unsigned n, void *bar, unsigned t)
{
	ctx *c = vc;

	if (!c || t >= c->nt)
		return;
	if (g_cnt)
		count(c, src, n, false);
	access(c, src, n, t, 16, "bulk copy source read");
	if (n == 0 || n % 16) {
		report(c, "thread %u: bulk copy of %u bytes (a positive multiple of 16)", t, n);
		return;
	}
	async_land(c, dst, n, bar, t, 16, "bulk copy");
}

/* A TMA tile load's box of n bytes at dst.  Its alignment (128 bytes, a
 * swizzle's repeat) is the verifier's rule tma: the host's shared arrays
 * do not sit at the device's addresses. */
static void ck_tma(void *vc, void *dst, unsigned n, void *bar, unsigned t)
{
	ctx *c = vc;

	if (c && t < c->nt)
		async_land(c, dst, n, bar, t, 1, "TMA load");
}

/* At a block's end: a bulk copy still in flight was never waited for. */
static void bulk_left(ctx *c)
{
	for (size_t i = 0; i < c->n_bp; i++)
		report(c, "a bulk copy of %u bytes into shared %s by thread %u on mbarrier %d is still in flight "
		       "when the block ends (no wait on its phase)", c->bp[i].bytes, c->bp[i].name, c->bp[i].t,
		       c->bp[i].bar);
	c->n_bp = 0;
}

/* ---- arms: warp-specialised kernels run as coroutines ------------------------------------ */

/* roles(): n arms, arm i threads [bounds[2i], bounds[2i + 1]) of the
 * host block, the rest one implicit arm n.  Checked (n from 1 to
 * MAX_ARMS, ranges within the block and disjoint; else reported and the
 * call ignored) before anything is kept.  One arm in all: nothing is
 * allocated, the checker runs as without the call.  Owns what it
 * allocates (freed by end(), or by a later roles()); out of memory:
 * c->oom.  The per-cell tables come at the next block() (arms_tables),
 * when the shared arrays are all known. */
static void ck_roles(void *vc, unsigned n, const unsigned *bounds)
{
	ctx *c = vc;
	unsigned long long covered = 0;
	arms *a;

	if (!c)
		return;
	if (n > MAX_ARMS) {
		report(c, "roles: more than %d arms (%u): the arms go unchecked", MAX_ARMS, n);
		return;
	}
	if (n == 0 || !bounds) {
		report(c, "roles: no arms given: the arms go unchecked");
		return;
	}
	for (unsigned i = 0; i < n; i++) {
		unsigned lo = bounds[2 * i], hi = bounds[2 * i + 1];

		if (lo > hi || hi > c->nt) {
			report(c, "roles: arm %u, threads [%u, %u), is not a range of the block's %u threads: the "
			       "arms go unchecked", i, lo, hi, c->nt);
			return;
		}
		for (unsigned j = 0; j < i; j++)
			if (lo < bounds[2 * j + 1] && bounds[2 * j] < hi) {
				report(c, "roles: arms %u and %u overlap: the arms go unchecked", j, i);
				return;
			}
		covered += hi - lo;
	}
	arms_free(c->am);
	c->am = NULL;
	if (n + (covered < c->nt) < 2)
		return;   /* one arm: as without roles() */
	a = calloc(1, sizeof(*a));
	if (!a) {
		c->oom = true;
		return;
	}
	a->n = n + (covered < c->nt);
	a->cw = a->n + MAX_MBAR;
	a->of = malloc(c->nt);
	a->vc = calloc((size_t)a->n * a->cw, sizeof(*a->vc));
	a->mclk = calloc((size_t)MAX_MBAR * 2 * a->cw, sizeof(*a->mclk));
	if (!a->of || !a->vc || !a->mclk) {
		arms_free(a);
		c->oom = true;
		return;
	}
	memset(a->of, (int)n, c->nt);   /* the implicit arm, unless in one of the n */
	for (unsigned i = 0; i < n; i++)
		for (unsigned t = bounds[2 * i]; t < bounds[2 * i + 1]; t++)
			a->of[t] = (uint8_t)i;
	for (unsigned A = 0; A < a->n; A++)
		a->rank[A] = -2;   /* no thread yet */
	for (unsigned t = 0; t < c->nt; t++) {
		int *rk = &a->rank[a->of[t]];

		*rk = *rk == -2 || *rk == (int)(t / c->bt) ? (int)(t / c->bt) : -1;
	}
	for (unsigned A = 0; A < a->n; A++)
		if (a->rank[A] == -2)
			a->rank[A] = -1;
	c->am = a;
}

/* mbarrier.try_wait.parity's answer now (PTX ISA, "mbarrier.test_wait /
 * mbarrier.try_wait": the wait for a parity completes once the phase of
 * that parity has): 1 when the current phase's parity differs from
 * `parity` (only its low bit counts), 0 when the wait would block.
 * Nothing changes: no copy lands, no thread acquires (mbar_wait does,
 * per thread).  An mbarrier never initialised in the block (reported) or
 * no context (begin() out of memory): 1, so that the kernel moves on. */
static int ck_mbar_ready(void *vc, void *bar, unsigned parity)
{
	ctx *c = vc;
	int b;

	if (!c || (b = mbar_find(c, bar, NO_THREAD, false, "mbarrier.try_wait")) < 0)
		return 1;
	return (c->mb[b].phase & 1u) != (parity & 1u);
}

/* The oldest bulk copy or TMA load in flight in the block, on any
 * mbarrier, lands (bulk_land: its bytes count down the barrier's
 * tx-count, PTX ISA "mbarrier" complete-tx, and may complete the phase):
 * 1, or 0 when none is in flight (or no context).  The kernel calls it
 * only when no arm can move, so that copies land as late as they may on
 * a GPU and a read before its wait is seen. */
static int ck_deliver(void *vc)
{
	ctx *c = vc;
	bulk_pend q;

	if (!c || !c->n_bp)
		return 0;
	q = c->bp[0];
	memmove(c->bp, c->bp + 1, (c->n_bp - 1) * sizeof(*c->bp));
	c->n_bp--;
	bulk_land(c, &q);
	return 1;
}

/* A deadlock the kernel found: no arm can move and no copy is in flight,
 * and the arm of threads [lo, hi) (thread indices of the host block)
 * waits on `bar` for `parity`.  One report per phase of the barrier
 * (mbar.stuck, shared with ck_mbar_wait's), whichever arms wait on it;
 * nothing when the wait could in fact go on (ready), a report when the
 * barrier was never initialised. */
static void ck_stuck(void *vc, void *bar, unsigned parity, unsigned lo, unsigned hi)
{
	ctx *c = vc;
	mbar *m;
	int b;

	if (!c || (b = mbar_find(c, bar, NO_THREAD, false, "a deadlocked wait")) < 0)
		return;
	m = &c->mb[b];
	if ((m->phase & 1u) != (parity & 1u) || m->stuck == m->phase + 1)
		return;
	m->stuck = m->phase + 1;
	if (hi <= lo)
		hi = lo + 1;
	report(c, "deadlock: the arm of threads %u..%u waits on mbarrier %d for the phase of parity %u: phase "
	       "%llu still expects %d arrival(s) of %d and %lld tx byte(s), and nothing else can complete it",
	       lo, hi - 1, b, parity & 1u, (unsigned long long)m->phase, m->pending, m->expected,
	       (long long)m->tx);
}

/* The coroutine a warp-specialised kernel's scheduler runs i-th of n in
 * this pass (print.c, print_roles_host): i, n - 1 - i, or -- random --
 * place i of a permutation drawn at i = 0 (Fisher-Yates on xorshift64:
 * Marsaglia, "Xorshift RNGs", 2003).  i itself for an i or n out of
 * range. */
static unsigned ck_order(void *vc, unsigned i, unsigned n)
{
	ctx *c = vc;

	if (!c || n > MAX_ARMS || i >= n)
		return i;
	if (c->sched == SCHED_REVERSE)
		return n - 1 - i;
	if (c->sched != SCHED_RANDOM)
		return i;
	if (i == 0) {
		for (unsigned j = 0; j < n; j++)
			c->perm[j] = j;
		for (unsigned j = n - 1; j > 0; j--) {
			unsigned r, t;

			c->rng ^= c->rng << 13;
			c->rng ^= c->rng >> 7;
			c->rng ^= c->rng << 17;
			r = (unsigned)(c->rng % (j + 1));
			t = c->perm[j];
			c->perm[j] = c->perm[r];
			c->perm[r] = t;
		}
	}
	return c->perm[i];
}

static const ap_hcheck_ops ops = {
	.begin = ck_begin,
	.end = ck_end,
	.region = ck_region,
	.block = ck_block,
	.rd = ck_rd,
	.wr = ck_wr,
	.async = ck_async,
	.commit = ck_commit,
	.wait = ck_wait,
	.barrier = ck_barrier,
	.fence_async = ck_fence_async,
	.wg_rd = ck_wg_rd,
	.wg_commit = ck_wg_commit,
	.wg_wait = ck_wg_wait,
	.lm_rd = ck_lm_rd,
	.mbar_init = ck_mbar_init,
	.mbar_arrive = ck_mbar_arrive,
	.mbar_wait = ck_mbar_wait,
	.bulk = ck_bulk,
	.tma = ck_tma,
	.roles = ck_roles,
	.mbar_ready = ck_mbar_ready,
	.deliver = ck_deliver,
	.stuck = ck_stuck,
	.order = ck_order,
};

const ap_hcheck_ops *ap_hostcheck_ops(void)
{
	return &ops;
}

/* hostcheck.h -- the ABI between host kernels printed in the checking mode
 * (server/kir/print.c, AP_KIR_HOST_CHECK) and the checker that runs them
 * (client/hostcheck.c).
 *
 * A checked host shared object exports one data symbol,
 *     const ap_hcheck_ops *ap_check_rt;
 * which the runtime sets (dlsym) to its checker's table before the first
 * launch.  The kernel calls through it: begin() once per call of the
 * kernel function (one worker's range of blocks), region() for every
 * buffer and shared array it may touch, block() at each block (a cluster
 * of blocks on the host: one wide block; it answers whether the block is
 * checked: the kernel skips every call below in a block it is not), then
 * per access rd()/wr() (which return the pointer, so an access reads
 * `*(T *)ops->rd(...)`), async()
 * for a cp.async, commit()/wait() for cp.async.commit_group/wait_group,
 * barrier() at each barrier, and end(); for sm_90a's wgmma (Hopper's
 * async proxy): fence_async() for fence.proxy.async.shared::cta, wg_rd()
 * for each shared element a wgmma reads (by the warpgroup of thread t,
 * pending until that warpgroup's wgmma.wait_group covers it), and
 * wg_commit() / wg_wait() for wgmma.commit_group / wait_group (every
 * thread of the warpgroup calls them; the warpgroup's first thread
 * counts); lm_rd() for the 16-byte row lane t gives an ldmatrix (a read,
 * which the counting also takes as part of the warp's instruction);
 * mbar_init() / mbar_arrive() (tx: expect_tx bytes, 0 for none) /
 * mbar_wait() for the mbarrier at `bar` (shared memory, 8 bytes), and
 * bulk() for a cp.async.bulk of `bytes` completing on `bar`, tma() for a
 * TMA tile load's box of `bytes` at dst (its source reads come through
 * rd(), element by element, from the host's load) -- the host
 * copies at once; the checker keeps the bytes pending until a wait on
 * the phase the copy completes (mbar_wait is called for every thread of
 * the block between phases).
 * Threads are numbered within the
 * host's (wide) block: thread t is in block rank t / block_threads of its
 * cluster.
 *
 * Warp-specialised kernels (sm_90a: a producer warpgroup issuing TMA
 * loads, consumer warpgroups computing) split the block's threads into
 * arms, roles that synchronise only through mbarriers.  The host kernel
 * runs each arm as a stackless coroutine: an arm runs (its threads in
 * thread loops) until it reaches an mbarrier wait whose phase is not
 * complete, then the next arm runs; copies land as late as possible.
 * The checker then keeps, besides the per-thread state above, one vector
 * clock per arm, so that what one arm did before an arrive is ordered
 * before what another arm does after the wait that sees the phase
 * complete (client/hostcheck.c).  The ops for it, appended last so that
 * objects printed before them still work:
 *   roles(n, bounds), once per kernel call right after begin() and before
 *     any block(): n arms (1 to 8), arm i being threads [bounds[2i],
 *     bounds[2i + 1]) of the host block (disjoint, within [0, threads));
 *     the threads in no arm form one more, implicit arm (numbered n).
 *     Without it every thread is in one arm and nothing changes.
 *   mbar_ready(bar, parity): 1 when mbarrier.try_wait.parity with that
 *     parity would succeed now (the current phase's parity differs from
 *     `parity`), else 0; no side effect, no copy lands.  The kernel calls
 *     mbar_wait() for every thread of the arm once it answers 1 (the
 *     acquire), mbar_arrive() from the elected thread of each arrival.
 *   deliver(): lands the oldest bulk copy or TMA load in flight in the
 *     block (any mbarrier): 1, or 0 when none is in flight.  The kernel
 *     calls it when no arm can move.
 *   stuck(bar, parity, lo, hi): when no arm can move and nothing is in
 *     flight, once per blocked arm (threads [lo, hi)): a deadlock report.
 * The mbarrier ops (mbar_init, mbar_arrive, mbar_wait, mbar_ready, bulk,
 * tma, deliver, stuck) keep the barriers' state in every block, the ones
 * block() answers 0 for included: the coroutines' schedule depends on it.
 *
 * The layout is written once, as AP_HCHECK_FIELDS: the header declares
 * the struct from it and the printer emits the same text
 * (AP_HCHECK_DECL) into every checked kernel's prelude.  Fields are only
 * ever appended: a kernel printed against a shorter struct reads the
 * runtime's longer table through its own prefix of it.
 */
#ifndef AP_HOSTCHECK_H
#define AP_HOSTCHECK_H

/* kinds of region() */
#define AP_HCHECK_GLOBAL 0
#define AP_HCHECK_SHARED 1

#define AP_HCHECK_FIELDS \
	void *(*begin)(const char *kernel, unsigned threads, unsigned block_threads, \
		       unsigned long long blocks); \
	void (*end)(void *ctx); \
	void (*region)(void *ctx, const void *base, unsigned long long bytes, const char *name, \
		       int kind, int rank, int param); \
	int (*block)(void *ctx, unsigned long long block); \
	const void *(*rd)(void *ctx, const void *p, unsigned bytes, unsigned t, unsigned align); \
	void *(*wr)(void *ctx, void *p, unsigned bytes, unsigned t, unsigned align); \
	void (*async)(void *ctx, void *dst, const void *src, unsigned bytes, unsigned t, int pred); \
	void (*commit)(void *ctx, unsigned t); \
	void (*wait)(void *ctx, unsigned t, int pending); \
	void (*barrier)(void *ctx, int cluster); \
	void (*fence_async)(void *ctx, unsigned t); \
	const void *(*wg_rd)(void *ctx, const void *p, unsigned bytes, unsigned t); \
	void (*wg_commit)(void *ctx, unsigned t); \
	void (*wg_wait)(void *ctx, unsigned t, int pending); \
	const void *(*lm_rd)(void *ctx, const void *p, unsigned t); \
	void (*mbar_init)(void *ctx, void *bar, unsigned count, unsigned t); \
	void (*mbar_arrive)(void *ctx, void *bar, unsigned tx, unsigned t); \
	void (*mbar_wait)(void *ctx, void *bar, unsigned parity, unsigned t); \
	void (*bulk)(void *ctx, void *dst, const void *src, unsigned bytes, void *bar, unsigned t); \
	void (*tma)(void *ctx, void *dst, unsigned bytes, void *bar, unsigned t); \
	void (*roles)(void *ctx, unsigned n, const unsigned *bounds); \
	int (*mbar_ready)(void *ctx, void *bar, unsigned parity); \
	int (*deliver)(void *ctx); \
	void (*stuck)(void *ctx, void *bar, unsigned parity, unsigned lo, unsigned hi); \
	unsigned (*order)(void *ctx, unsigned i, unsigned n);

typedef struct ap_hcheck_ops {
	AP_HCHECK_FIELDS
} ap_hcheck_ops;

#define AP_HCHECK_STR_(...) #__VA_ARGS__
#define AP_HCHECK_STR(...) AP_HCHECK_STR_(__VA_ARGS__)
/* The struct's declaration as C text, for the printed prelude. */
#define AP_HCHECK_DECL \
	"typedef struct ap_hcheck_ops { " AP_HCHECK_STR(AP_HCHECK_FIELDS) " } ap_hcheck_ops;\n"

#endif

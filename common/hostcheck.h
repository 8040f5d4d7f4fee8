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
 * The layout is written once, as AP_HCHECK_FIELDS: the header declares
 * the struct from it and the printer emits the same text
 * (AP_HCHECK_DECL) into every checked kernel's prelude.
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
	void (*tma)(void *ctx, void *dst, unsigned bytes, void *bar, unsigned t);

typedef struct ap_hcheck_ops {
	AP_HCHECK_FIELDS
} ap_hcheck_ops;

#define AP_HCHECK_STR_(...) #__VA_ARGS__
#define AP_HCHECK_STR(...) AP_HCHECK_STR_(__VA_ARGS__)
/* The struct's declaration as C text, for the printed prelude. */
#define AP_HCHECK_DECL \
	"typedef struct ap_hcheck_ops { " AP_HCHECK_STR(AP_HCHECK_FIELDS) " } ap_hcheck_ops;\n"

#endif

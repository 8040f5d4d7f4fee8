/* kernels.c -- one request's kernels: looked up, compiled in parallel
 * in few programs, and rebuilt when the backend refuses one.
 *
 * Kernels of one request are compiled in parallel, and in few programs:
 * NVRTC and cc cost tens of milliseconds per program before the first
 * kernel (headers, start-up), and the kernels of one program are
 * independent.  The compiler owns `threads - 1` helper threads, started
 * once; a request first looks up every kernel (caches, flights), then
 * deals the kernels it must compile to one translation unit per worker
 * (the printers guard what kernels share), runs one backend compile per
 * group -- its worker and the helpers each taking groups, so it never
 * waits on helpers busy elsewhere -- and gives every kernel of a group the
 * group's blob, found by entry name.  A blob is stored once
 * (content-addressed in L1; by digest in L2) and carried once per bundle
 * (Kernel.blob_of).  A group the backend rejects is compiled kernel by
 * kernel, so the rejection names its kernel.
 *
 * Cluster leases per kernel (issue 26, item 1; lease.h): the kernel
 * flight's leader that missed L1 and L2 takes the kernel's lease in Redis
 * (kind AP_REDIS_KERNEL, keyed by the kernel key) without waiting, so that
 * two daemons compiling two different cold graphs that share a kernel
 * compile it once.  Taken, it compiles the kernel in its group and
 * releases the lease once L2 holds the kernel's entry (or it failed).
 * Found held, the kernel waits -- but only after this request compiled
 * its own kernels and released their leases (wait_leased): a request
 * never sleeps holding a kernel lease, so a daemon compiling A that holds
 * X and needs Y never waits for one compiling B that holds Y and needs X
 * (each releases its own before waiting for the other's).  The wait polls
 * L2 until flight_wait_ms from the request's start: the entry appearing
 * answers the kernel (tier L2); a holder that lapsed without its entry
 * is taken over and the kernel compiled here; at the bound, cancelled, or
 * with Redis unreachable (the breaker open), it is compiled alone.
 *
 * Backend refusals (upward feedback, issue 3): a kernel NVRTC or cc
 * rejects (AP_ECOMPILE) does not fail the request.  The parallel round
 * still compiles every other kernel; then the program is built again with
 * a backend hook (ap_build_options.accept_kernel) that answers from the
 * blobs of that round by kernel name and compiles only new kernels (the
 * halves of split groups), so a fused group the backend rejects is split
 * and no kernel is compiled twice.  Only a single-node kernel that does
 * not compile fails the request.  Test hook:
 * $APOLLO_TEST_REFUSE_KERNEL_NODES=N (read once, when the compiler is
 * created) makes the backend reject every kernel of more than N member
 * nodes (an #error line after its source: NVRTC or cc rejects it, and the
 * program it is in, for real), as $APOLLO_TEST_COMPILE_DELAY_MS=MS delays
 * every request.
 */
#include "compile_internal.h"

/* ---- kernels -------------------------------------------------------------- */

/* Kernel `key` through the tiers (ap_tiers_kernel_get: L1, else L2 and
 * copied into L1; `flags` AP_TIERS_L1_ONLY: L1 alone): true with out's
 * blob, digest and tier. */
static bool kernel_cached(const struct kernel_batch *kb, const uint8_t key[32], unsigned flags,
			  struct kblob *out)
{
	int tier = ap_tiers_kernel_get(kb->c->tiers, key, flags, &out->data, &out->len, out->digest);

	if (tier == AP_TIER_MISS)
		return false;
	out->tier = tier;
	return true;
}

/* Runs the backend on translation unit `src` (file name `file`) into
 * `out`: its blob and digest, or rc and err. */
static void backend_run(const struct kernel_batch *kb, const char *src, const char *file,
			struct kblob *out)
{
	if (kb->gpu)
		out->rc = ap_nvrtc_compile_with(kb->nvrtc, src, file, kb->target,
						kb->output == APOLLO__OUTPUT_KIND__OUTPUT_CUBIN, NULL, 0,
						&out->data, &out->len, NULL, &out->err);
	else
		out->rc = ap_hostcc_compile(src, &out->data, &out->len, &out->err);
	if (out->rc)
		return;
	out->compiled = true;
	out->tier = APOLLO__CACHE_TIER__CACHE_COMPILED;
	ap_sha256(out->data, out->len, out->digest);
}

/* Stores the blob of `out` in L2 by its digest (once per backend run:
 * every kernel of a program shares it; L1 stores it with each kernel). */
static void blob_store(const struct kernel_batch *kb, const struct kblob *out)
{
	if (kb->use_cache)
		ap_tiers_blob_put(kb->c->tiers, out->data, out->len, out->digest);
}

/* Stores kernel `key` -> out's blob through the tiers: in L1 with the blob
 * (content-addressed: a blob several kernels share is stored once), in L2
 * key -> its digest (the blob itself: blob_store). */
static void kernel_store(const struct kernel_batch *kb, const uint8_t key[32], const struct kblob *out)
{
	if (kb->use_cache)
		ap_tiers_kernel_put(kb->c->tiers, key, 0, out->data, out->len, out->digest);
}

/* One translation unit of kernels ks[0..n) (the printers guard what
 * kernels share, so sources concatenate), malloc'd; NULL when out of
 * memory.  The test hook $APOLLO_TEST_REFUSE_KERNEL_NODES=N adds, after
 * every kernel of more than N member nodes (ap_kernel_src.n_members), an
 * #error line: the backend itself rejects it and the program it is in. */
static char *program_src(const struct kernel_batch *kb, const ap_kernel_src *const *ks, int n)
{
	char *src = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&src, &len);

	if (!f)
		return NULL;
	for (int i = 0; i < n; i++) {
		fprintf(f, "%s\n", ks[i]->src);
		if (kb->c->refuse_nodes && ks[i]->n_members > 0 &&
		    (unsigned)ks[i]->n_members > kb->c->refuse_nodes)
			fprintf(f, "#error \"test hook APOLLO_TEST_REFUSE_KERNEL_NODES=%u: a kernel of %d "
				"member nodes does not compile\"\n", kb->c->refuse_nodes, ks[i]->n_members);
	}
	if (ferror(f)) {
		fclose(f);
		free(src);
		return NULL;
	}
	fclose(f);
	return src;
}

/* Whether kb's request was cancelled: then out gets AP_EBUSY and no
 * backend runs (a kernel flight it leads publishes that error). */
static bool cancelled(const struct kernel_batch *kb, struct kblob *out)
{
	if (!kb->cancel || !atomic_load(kb->cancel))
		return false;
	out->rc = ap_error_set(&out->err, AP_EBUSY, NULL, NULL,
			       "cancelled: apollod is stopping");
	return true;
}

/* Runs the backend on kernel `ks` alone into `out` and stores the blob. */
static void kernel_backend(const struct kernel_batch *kb, const ap_kernel_src *ks,
			   const uint8_t key[32], struct kblob *out)
{
	char file[160];
	char *src;

	if (cancelled(kb, out))
		return;
	if (!(src = program_src(kb, &ks, 1))) {
		out->rc = ap_error_set(&out->err, AP_ENOMEM, NULL, NULL, "out of memory");
		return;
	}
	snprintf(file, sizeof(file), "%s.cu", ks->name);
	backend_run(kb, src, file, out);
	free(src);
	if (out->rc) {
		if (!out->err.node[0] && ks->n_nodes > 0)
			snprintf(out->err.node, sizeof(out->err.node), "%s", ks->nodes[0]);
		return;
	}
	blob_store(kb, out);
	kernel_store(kb, key, out);
}

/* A kernel flight's leader publishes `out`: its digest and blob, or its
 * error. */
static void kernel_publish(ap_compiler *c, ap_flight *f, const struct kblob *out)
{
	uint8_t *bytes = out->rc ? NULL : malloc(32 + out->len);

	if (!out->rc && !bytes) {
		ap_error e;

		ap_flight_finish(c->kflights, f, ap_error_set(&e, AP_ENOMEM, NULL, NULL, "out of memory"),
				 &e, NULL, 0);
		return;
	}
	if (bytes) {
		memcpy(bytes, out->digest, 32);
		memcpy(bytes + 32, out->data, out->len);
	}
	ap_flight_finish(c->kflights, f, out->rc, &out->err, bytes, 32 + out->len);
}

/* A follower of a kernel flight: true when the leader's outcome (blob or
 * error) is now out's; false when the wait ran out (compile alone). */
static bool kernel_follow(const struct kernel_batch *kb, ap_flight *f, struct kblob *out)
{
	uint8_t *bytes = NULL;
	size_t len = 0;
	int rc = 0;

	if (!ap_flight_wait(kb->c->kflights, f, kb->deadline, &rc, &out->err, &bytes, &len))
		return false;
	if (rc || len < 32) {
		out->rc = rc ? rc : ap_error_set(&out->err, AP_EINTERNAL, NULL, NULL,
						 "a kernel flight published nothing");
		free(bytes);
		return true;
	}
	memcpy(out->digest, bytes, 32);
	memmove(bytes, bytes + 32, len - 32);
	out->data = bytes;
	out->len = len - 32;
	out->tier = APOLLO__CACHE_TIER__CACHE_SHARED;
	return true;
}

/* ap_lease_claim's found(): kernel `key` from L1 or L2 into `out`. */
struct kfind {
	const struct kernel_batch *kb;
	const uint8_t *key;
	struct kblob *out;
};

static bool kernel_found(void *user)
{
	struct kfind *f = user;

	return kernel_cached(f->kb, f->key, 0, f->out);
}

/* What must happen to a kernel before it can be compiled: its source
 * checked, its key made, L1 and L2 asked, its flight joined, its cluster
 * lease taken.  K_DONE: `out` holds the blob (from L1, L2) or the
 * failure; K_FOLLOW: another request compiles it, *f is the flight to
 * wait on; K_LEASED: another daemon holds its lease, *w is the wait, and
 * this request leads flight *f (NULL: none); K_COMPILE: this request
 * compiles it, leading flight *f (NULL: none), holding lease *l (NULL:
 * none -- no leases, Redis unavailable). */
static int kernel_probe(const struct kernel_batch *kb, const ap_kernel_src *ks, uint8_t key[32],
			struct kblob *out, ap_flight **f, ap_lease **l, ap_lease_wait **w)
{
	const char *src = ks->src;
	const char *bid = kb->backend;

	*f = NULL;
	*l = NULL;
	*w = NULL;
	ap_error_clear(&out->err);
	if (!src) {
		out->rc = ap_error_set(&out->err, AP_EINTERNAL, ks->n_nodes ? ks->nodes[0] : NULL, NULL,
				       "kernel %s has no %s source", ks->name, kb->gpu ? "CUDA" : "host");
		return K_DONE;
	}
	if (ap_compile_kernel_key(src, ks->name, kb->target, kb->output, bid, key)) {
		out->rc = ap_error_set(&out->err, AP_ENOMEM, NULL, NULL, "out of memory");
		return K_DONE;
	}
	if (kb->use_cache && kernel_cached(kb, key, 0, out))
		return K_DONE;
	if (kb->use_cache && kb->c->kflights) {
		int role = ap_flight_join(kb->c->kflights, key, f);

		if (role == AP_FLIGHT_FOLLOW)
			return K_FOLLOW;
		if (role == AP_FLIGHT_LEAD && kernel_cached(kb, key, AP_TIERS_L1_ONLY, out)) {
			/* a flight stored it between our miss and our join */
			kernel_publish(kb->c, *f, out);
			*f = NULL;
			return K_DONE;
		}
		if (role != AP_FLIGHT_LEAD)
			*f = NULL;
	}
	if (kb->use_cache && kb->c->leases) {
		struct kfind fd = { kb, key, out };

		switch (ap_lease_try(kb->c->leases, AP_REDIS_KERNEL, key, kernel_found, &fd, l, w)) {
		case AP_LEASE_FOUND:   /* stored, its lease released, since our miss */
			if (*f)
				kernel_publish(kb->c, *f, out);
			*f = NULL;
			return K_DONE;
		case AP_LEASE_WAIT:
			return K_LEASED;
		default:
			break;
		}
	}
	return K_COMPILE;
}

/* Kernel `key`'s wait *w for another daemon's lease, to its end: true
 * when `out` holds the holder's entry (from L2); false to compile,
 * holding *l (taken over after the holder lapsed) or alone. */
static bool kernel_wait_lease(const struct kernel_batch *kb, const uint8_t key[32],
			      struct kblob *out, ap_lease_wait *w, ap_lease **l)
{
	struct kfind fd = { kb, key, out };

	return ap_lease_await(kb->c->leases, w, kb->deadline, kb->cancel, kernel_found, &fd, l) ==
	       AP_LEASE_FOUND;
}

/* One kernel alone into `out` (the rebuild after a refusal asks kernel by
 * kernel): probe, then its flight's outcome or the backend. */
static void compile_kernel(const struct kernel_batch *kb, const ap_kernel_src *ks, struct kblob *out)
{
	uint8_t key[32];
	ap_flight *f = NULL;
	ap_lease *l = NULL;
	ap_lease_wait *w = NULL;
	int st = kernel_probe(kb, ks, key, out, &f, &l, &w);

	if (st == K_FOLLOW) {
		if (kernel_follow(kb, f, out))
			return;
		f = NULL;   /* the wait ran out (and let go of the flight): alone */
	}
	if (st == K_DONE)
		return;
	if (st != K_LEASED || !kernel_wait_lease(kb, key, out, w, &l))
		kernel_backend(kb, ks, key, out);
	ap_lease_release(kb->c->leases, l);   /* after kernel_backend stored it */
	if (f)
		kernel_publish(kb->c, f, out);
}

static void probe_task(int i, void *arg)
{
	struct kernel_batch *kb = arg;
	struct kblob *b = &kb->blobs[i];

	kb->state[i] = kernel_probe(kb, &kb->p->kernels[i], kb->keys[i], b, &kb->flight[i],
				    &kb->lease[i], &kb->lwait[i]);
}

/* Group g of the kernels this request compiles: one translation unit
 * (the printers guard what kernels share, so sources concatenate), one
 * backend run -- NVRTC's and the host compiler's fixed cost once per
 * worker, not per kernel (issue: cold compiles at the NVRTC floor).  Each
 * kernel gets the whole blob (stored once, content-addressed; the bundle
 * carries it once, Kernel.blob_of) and finds its entry by name.  When the
 * backend rejects the group, each kernel is compiled alone, so the
 * rejection names its kernel (the driver's refusal feedback). */
static void group_task(int g, void *arg)
{
	struct kernel_batch *kb = arg;
	const ap_program *p = kb->p;
	const ap_kernel_src **ks = malloc(((size_t)p->n_kernels + 1) * sizeof(*ks));
	struct kblob whole;
	int n = 0, first = -1;
	char *src = NULL, file[48];

	memset(&whole, 0, sizeof(whole));
	for (int i = 0; ks && i < p->n_kernels; i++)
		if (kb->state[i] == K_COMPILE && kb->group_of[i] == g) {
			first = first < 0 ? i : first;
			ks[n++] = &p->kernels[i];
		}
	/* compiled even when the request has failed already: this request
	 * leads these kernels' flights, and a follower elsewhere must get
	 * the kernel, not this request's failure */
	if (n == 1) {
		kernel_backend(kb, ks[0], kb->keys[first], &kb->blobs[first]);
	} else if (cancelled(kb, &whole)) {
		;
	} else if (!ks || !(src = program_src(kb, ks, n))) {
		whole.rc = ap_error_set(&whole.err, AP_ENOMEM, NULL, NULL, "out of memory");
	} else {
		snprintf(file, sizeof(file), "apollo_group%d.cu", g);
		backend_run(kb, src, file, &whole);
		free(src);
		if (whole.rc == 0)
			blob_store(kb, &whole);
	}
	free(ks);
	ap__progress_kernels(kb->progress, (unsigned)n);
	for (int i = 0; i < p->n_kernels; i++) {
		struct kblob *out = &kb->blobs[i];

		if (kb->state[i] != K_COMPILE || kb->group_of[i] != g)
			continue;
		if (n > 1 || whole.rc) {
			if (whole.rc == AP_ECOMPILE) {
				kernel_backend(kb, &p->kernels[i], kb->keys[i], out);
			} else if (whole.rc) {
				out->rc = whole.rc;
				out->err = whole.err;
			} else if (!(out->data = malloc(whole.len ? whole.len : 1))) {
				out->rc = ap_error_set(&out->err, AP_ENOMEM, NULL, NULL, "out of memory");
			} else {
				memcpy(out->data, whole.data, whole.len);
				out->len = whole.len;
				memcpy(out->digest, whole.digest, 32);
				out->compiled = true;
				out->tier = APOLLO__CACHE_TIER__CACHE_COMPILED;
				kernel_store(kb, kb->keys[i], out);
			}
		}
		/* stored in L2 (or failed): others may take it, or the lease */
		ap_lease_release(kb->c->leases, kb->lease[i]);
		kb->lease[i] = NULL;
		if (kb->flight[i]) {
			kernel_publish(kb->c, kb->flight[i], out);
			kb->flight[i] = NULL;
		}
	}
	free(whole.data);
}

/* One round of group_task over the kernels in K_COMPILE, n_miss of them
 * dealt to groups 0..workers-1 (group_of), compiled each holding its
 * lease (if any) and nothing else; then K_DONE. */
static void compile_round(ap_compiler *c, struct kernel_batch *kb, int n_miss, int workers)
{
	kb->n_groups = n_miss < workers ? n_miss : workers;
	ap__compile_run_tasks(c, kb->n_groups, group_task, kb);
	for (int i = 0; i < kb->p->n_kernels; i++)
		if (kb->state[i] == K_COMPILE)
			kb->state[i] = K_DONE;
}

/* The kernels whose cluster lease another daemon held at the probe
 * (K_LEASED), after this request compiled its own and released their
 * leases: polled together, one sleep a round, until each is answered
 * from L2 (K_DONE, its flight published) or must be compiled here --
 * taken over after its holder lapsed, or alone at the deadline, when
 * cancelled, or without Redis -- those of a round compiled in a round of
 * their own (compile_round) before the next sleep.  So this request never
 * sleeps holding a kernel lease, and two daemons never wait for each
 * other's kernels (each has released its own before waiting). */
static void wait_leased(ap_compiler *c, struct kernel_batch *kb, int workers)
{
	int n = kb->p->n_kernels;

	for (;;) {
		double pause = -1;
		int n_miss = 0;

		for (int i = 0; i < n; i++)
			if (kb->state[i] == K_LEASED) {
				double p = ap_lease_pause(c->leases, kb->lwait[i], kb->deadline);

				pause = pause < 0 || p < pause ? p : pause;
			}
		if (pause < 0)
			return;
		ap_lease_sleep(pause);
		for (int i = 0; i < n; i++) {
			struct kfind fd = { kb, kb->keys[i], &kb->blobs[i] };
			int st;

			if (kb->state[i] != K_LEASED)
				continue;
			st = ap_lease_poll(c->leases, kb->lwait[i], kb->deadline, kb->cancel,
					   kernel_found, &fd, &kb->lease[i]);
			if (st == AP_LEASE_WAIT)
				continue;
			kb->lwait[i] = NULL;
			if (st != AP_LEASE_FOUND) {
				kb->state[i] = K_COMPILE;
				kb->group_of[i] = n_miss++ % workers;
				continue;
			}
			kb->state[i] = K_DONE;
			ap__progress_kernels(kb->progress, 1);
			if (kb->flight[i]) {
				kernel_publish(c, kb->flight[i], &kb->blobs[i]);
				kb->flight[i] = NULL;
			}
		}
		if (n_miss)
			compile_round(c, kb, n_miss, workers);
	}
}

/* A kernel another request compiles: its outcome, or, when the wait runs
 * out, a compile of its own. */
static void follow_task(int i, void *arg)
{
	struct kernel_batch *kb = arg;
	struct kblob *out = &kb->blobs[i];

	if (kb->state[i] != K_FOLLOW)
		return;
	if (!kernel_follow(kb, kb->flight[i], out))
		kernel_backend(kb, &kb->p->kernels[i], kb->keys[i], out);
	kb->flight[i] = NULL;
}

/* ---- the task pool: the request's worker and the helper threads ----------- */

/* Removes `tb` from the queue of batches with tasks left (under c->mu). */
static void dequeue(ap_compiler *c, struct task_batch *tb)
{
	struct task_batch **pp = &c->queue;

	while (*pp && *pp != tb)
		pp = &(*pp)->queue_next;
	if (*pp)
		*pp = tb->queue_next;
}

/* Takes the next task of `tb` (under c->mu); -1 when none is left.  A
 * batch with nothing left to hand out leaves the queue. */
static int take_index(ap_compiler *c, struct task_batch *tb)
{
	int i;

	if (tb->next >= tb->n) {
		dequeue(c, tb);
		return -1;
	}
	i = tb->next++;
	if (tb->next == tb->n)
		dequeue(c, tb);
	return i;
}

/* Runs task i of `tb` outside the lock and records it (takes c->mu). */
static void run_index(ap_compiler *c, struct task_batch *tb, int i)
{
	pthread_mutex_unlock(&c->mu);
	tb->fn(i, tb->arg);
	pthread_mutex_lock(&c->mu);
	tb->done++;
	if (tb->done == tb->n)
		pthread_cond_signal(&tb->finished);
}

/* Helper thread: serves the queue of batches until the compiler is freed.
 * Helpers live as long as the compiler, so per-thread library state
 * (OpenSSL's error queue, NVRTC's) is set up once, not per request. */
void *ap__compile_helper_main(void *arg)
{
	ap_compiler *c = arg;

	pthread_mutex_lock(&c->mu);
	for (;;) {
		struct task_batch *tb;
		int i;

		while (!c->stop && !c->queue)
			pthread_cond_wait(&c->work, &c->mu);
		if (c->stop)
			break;
		tb = c->queue;
		i = take_index(c, tb);
		if (i >= 0)
			run_index(c, tb, i);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

/* Runs fn(0..n-1, arg) with the helpers' help, the calling worker taking
 * its share, and returns when every task is done (ap_task_pool.run). */
void ap__compile_run_tasks(void *pool, int n, void (*fn)(int i, void *arg), void *arg)
{
	ap_compiler *c = pool;
	struct task_batch tb = {.n = n, .fn = fn, .arg = arg};
	int i;

	if (n <= 0)
		return;
	pthread_cond_init(&tb.finished, NULL);
	pthread_mutex_lock(&c->mu);
	if (c->n_helpers > 0 && n > 1) {
		struct task_batch **pp = &c->queue;

		while (*pp)
			pp = &(*pp)->queue_next;
		*pp = &tb;
		pthread_cond_broadcast(&c->work);
	}
	while ((i = take_index(c, &tb)) >= 0)
		run_index(c, &tb, i);
	while (tb.done < tb.n)
		pthread_cond_wait(&tb.finished, &c->mu);
	pthread_mutex_unlock(&c->mu);
	pthread_cond_destroy(&tb.finished);
}

/* Compiles (or fetches) every kernel of `p` on the task pool: first each
 * kernel's key, caches and flight (probe_task); then the kernels this
 * request compiles, dealt in program order to one group per worker (the
 * request's worker and the helpers) as cards are dealt, one backend run per
 * group (group_task) -- a program repeats its kinds of kernel layer after
 * layer, so dealing spreads each kind evenly; balancing by source bytes
 * was measured worse (bench/compile.sh: prenorm_layer_train 1.21x the
 * NVRTC floor against 1.02x), since NVRTC's time is not proportional to a
 * source's length; then the
 * kernels whose cluster lease another daemon held (wait_leased), after
 * this request released its own leases; last the
 * kernels another request was compiling (follow_task) -- after this
 * request has published its own, so two requests waiting on each other's
 * flights never both wait.  0, or the first failure's code with `err`
 * copied from it, a failure other than AP_ECOMPILE first: after an
 * AP_ECOMPILE every kernel has still been tried. */
int ap__compile_kernels(ap_compiler *c, struct kernel_batch *kb, const ap_program *p,
			   struct kblob *blobs, ap_error *err)
{
	int i, n = p->n_kernels, rc = 0, workers = (int)c->n_helpers + 1, n_miss = 0;

	kb->p = p;
	kb->blobs = blobs;
	kb->keys = calloc((size_t)n + 1, sizeof(*kb->keys));
	kb->state = calloc((size_t)n + 1, sizeof(*kb->state));
	kb->flight = calloc((size_t)n + 1, sizeof(*kb->flight));
	kb->group_of = calloc((size_t)n + 1, sizeof(*kb->group_of));
	kb->lease = calloc((size_t)n + 1, sizeof(*kb->lease));
	kb->lwait = calloc((size_t)n + 1, sizeof(*kb->lwait));
	if (!kb->keys || !kb->state || !kb->flight || !kb->group_of || !kb->lease || !kb->lwait) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		goto out;
	}
	/* a cancellable request (the background tuner's) compiles one kernel
	 * per program: each backend run is short, and the cancellation is
	 * seen between two of them */
	if (kb->cancel)
		workers = n > 0 ? n : 1;
	ap__compile_run_tasks(c, n, probe_task, kb);
	for (i = 0; i < n; i++)
		if (kb->state[i] == K_COMPILE)
			kb->group_of[i] = n_miss++ % workers;
	if (kb->progress) {
		/* backend n of m: the kernels found cached count as done */
		unsigned hits = 0;

		kb->progress->backend_total = (uint32_t)n;
		ap__progress(kb->progress, "backend", 0, (uint32_t)n);
		for (i = 0; i < n; i++)
			hits += kb->state[i] == K_DONE;
		ap__progress_kernels(kb->progress, hits);
	}
	for (i = 0; i < n && c->klease_hold_ms; i++)
		if (kb->lease[i]) {
			ap_lease_sleep(c->klease_hold_ms);   /* test hook: a slow holder */
			break;
		}
	compile_round(c, kb, n_miss, workers);
	wait_leased(c, kb, workers);
	ap__compile_run_tasks(c, n, follow_task, kb);
	ap__progress_kernels(kb->progress, (unsigned)n);   /* the followed ones: all done */
	for (i = 0; i < n; i++) {
		if (blobs[i].rc && blobs[i].rc != AP_ECOMPILE) {
			*err = blobs[i].err;
			rc = blobs[i].rc;
			goto out;
		}
	}
	for (i = 0; i < n; i++) {
		if (blobs[i].rc) {
			*err = blobs[i].err;
			rc = blobs[i].rc;
			goto out;
		}
	}
out:
	for (i = 0; kb->lease && i < n; i++)
		ap_lease_release(c->leases, kb->lease[i]);   /* none left but after a failure */
	free(kb->keys);
	free(kb->state);
	free(kb->flight);
	free(kb->group_of);
	free(kb->lease);
	free(kb->lwait);
	kb->keys = NULL;
	kb->state = NULL;
	kb->flight = NULL;
	kb->group_of = NULL;
	kb->lease = NULL;
	kb->lwait = NULL;
	return rc;
}

/* ---- backend refusals (upward feedback) ------------------------------------ */

static void kmemo_clear(struct kmemo *m)
{
	for (int i = 0; i < m->n; i++) {
		free(m->names[i]);
		free(m->blobs[i].data);
	}
	free(m->names);
	free(m->blobs);
	memset(m, 0, sizeof(*m));
}

static int kmemo_find(const struct kmemo *m, const char *name)
{
	for (int i = 0; i < m->n; i++)
		if (strcmp(m->names[i], name) == 0)
			return i;
	return -1;
}

/* Appends (name, *b), taking b's data; 0 or AP_ENOMEM (b's data freed). */
static int kmemo_add(struct kmemo *m, const char *name, struct kblob *b)
{
	char *nm = strdup(name);

	if (m->n == m->cap) {
		int ncap = m->cap ? 2 * m->cap : 16;
		char **nn = realloc(m->names, (size_t)ncap * sizeof(*nn));
		struct kblob *nb = nn ? realloc(m->blobs, (size_t)ncap * sizeof(*nb)) : NULL;

		if (nn)
			m->names = nn;
		if (nb)
			m->blobs = nb;
		if (!nn || !nb) {
			free(nm);
			free(b->data), b->data = NULL;
			return AP_ENOMEM;
		}
		m->cap = ncap;
	}
	if (!nm) {
		free(b->data), b->data = NULL;
		return AP_ENOMEM;
	}
	m->names[m->n] = nm;
	m->blobs[m->n++] = *b;
	b->data = NULL;
	return 0;
}

/* ap_build_options.accept_kernel: the backend's verdict on kernel k, from
 * the memo or compiled now (through the kernel cache) and remembered, so
 * that a kernel is compiled once per request.  0, AP_ENOMEM, or the
 * backend's error code with its message in `why`. */
static int on_accept_kernel(const ap_kernel_src *k, void *user, ap_error *why)
{
	struct kmemo *m = user;
	int i = kmemo_find(m, k->name);
	struct kblob b;

	if (i < 0) {
		double t = ap_now_ms();

		memset(&b, 0, sizeof(b));
		compile_kernel(m->kb, k, &b);
		m->ms += ap_now_ms() - t;
		if (kmemo_add(m, k->name, &b) < 0)
			return AP_ENOMEM;
		i = m->n - 1;
	}
	if (m->blobs[i].rc && why)
		*why = m->blobs[i].err;
	return m->blobs[i].rc;
}

/* After the parallel compile of *progp rejected a kernel (AP_ECOMPILE):
 * remembers every blob by kernel name, builds the program again with
 * on_accept_kernel as the backend hook, and replaces *progp and *blobsp
 * by the new program and its blobs.  *compiled counts the backend compiles
 * of both rounds, *backend_ms adds the hook's compile time.  0, or an
 * error with `err` set (AP_ECOMPILE when a single-node kernel does not
 * compile, from ap_program_build). */
int ap__compile_rebuild_refused(ap_compiler *c, const ap_graph *g, ap_build_options *bo,
			   struct kernel_batch *kb, ap_program **progp, struct kblob **blobsp,
			   unsigned *compiled, double *backend_ms, ap_error *err)
{
	ap_program *prog = *progp;
	struct kblob *blobs = *blobsp;
	struct kmemo m;
	int rc = 0, n = prog->n_kernels;

	memset(&m, 0, sizeof(m));
	m.kb = kb;
	kb->p = NULL;
	for (int i = 0; i < n && rc == 0; i++)
		rc = kmemo_add(&m, prog->kernels[i].name, &blobs[i]);
	for (int i = 0; i < n; i++)
		free(blobs[i].data);
	free(blobs);
	*blobsp = NULL;
	*progp = ap_program_free(prog);
	if (rc) {
		kmemo_clear(&m);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	bo->accept_kernel = on_accept_kernel;
	bo->accept_user = &m;
	ap_error_clear(err);
	prog = ap_program_build(g, bo, err);
	bo->accept_kernel = NULL;
	bo->accept_user = NULL;
	*backend_ms += m.ms;
	for (int i = 0; i < m.n; i++)
		*compiled += m.blobs[i].compiled;
	if (!prog) {
		kmemo_clear(&m);
		return err->code ? err->code : AP_EINTERNAL;
	}
	*progp = prog;
	blobs = calloc((size_t)prog->n_kernels + 1, sizeof(*blobs));
	if (!blobs) {
		kmemo_clear(&m);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	*blobsp = blobs;
	for (int i = 0; i < prog->n_kernels; i++) {
		int j = kmemo_find(&m, prog->kernels[i].name);

		/* every kept kernel was offered to on_accept_kernel and accepted */
		if (j < 0 || m.blobs[j].rc || !m.blobs[j].data) {
			kmemo_clear(&m);
			return ap_error_set(err, AP_EINTERNAL, NULL, NULL,
					    "kernel %s was kept without the backend's blob",
					    prog->kernels[i].name);
		}
		blobs[i] = m.blobs[j];
		m.blobs[j].data = NULL;
	}
	kmemo_clear(&m);
	return 0;
}

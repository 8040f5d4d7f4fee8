/* lease.c -- cluster leases for cold requests (see lease.h).
 *
 * Approach: the Redis side is redis.c's (take, holder, renew, release,
 * each one command); here, the list of leases this daemon holds, the
 * renewal thread that walks it every ttl_ms / 3, and the wait loop.  The
 * renewal thread copies the list under the mutex and renews the copies
 * outside it: a lease released meanwhile is simply not found by its
 * compare-and-PEXPIRE (its token no longer holds the key), so a renewal
 * never brings a released lease back.  A waiter sleeps between polls on
 * its own worker thread (the request's), never on the event loop.
 */
#include "lease.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../common/graph.h"
#include "../cache/redis.h"
#include "../config.h"

#define POLL_FIRST_MS 20.0   /* the first pause of a wait; doubled after each poll */
#define POLL_MAX_MS 250.0    /* the longest pause (at most ttl_ms / 4) */

struct ap_lease {
	ap_redis_lease l;
	bool lost;             /* a renewal found it gone (counted once) */
	ap_lease *next;        /* in ls->held */
};

struct ap_leases {
	struct ap_redis *r;
	unsigned ttl_ms;
	pthread_mutex_t mu;
	pthread_cond_t cv;     /* the renewal thread's tick, and its stop */
	bool stop;
	pthread_t thread;
	ap_lease *held;        /* under mu */
	ap_lease_counts n[2];  /* under mu: requests' leases, kernels' (ix) */
};

/* A wait for another daemon's lease (lease.h, ap_lease_try). */
struct ap_lease_wait {
	ap_lease *mine;        /* the token this daemon tried (and tries) with */
	char seen[AP_REDIS_TOKEN_CHARS + 1];   /* the last holder seen ("" unknown) */
	bool held;             /* one was seen since the last lapse */
	double pause;          /* the next back-off, ms */
};

/* The counts of leases of `kind`: requests' or kernels'. */
static int ix(int kind)
{
	return kind == AP_REDIS_KERNEL;
}

void ap_lease_sleep(double ms)
{
	struct timespec ts;

	if (ms <= 0)
		return;
	ts.tv_sec = (time_t)(ms / 1e3);
	ts.tv_nsec = (long)((ms - (double)ts.tv_sec * 1e3) * 1e6);
	nanosleep(&ts, NULL);
}

/* The first hex digits of a key, for the log. */
static void key_label(const uint8_t key[32], char out[17])
{
	ap_hex(key, 8, out);
}

/* ---- renewals ---------------------------------------------------------------- */

/* Marks the held lease with `token` lost (once: counted and logged). */
static void mark_lost(ap_leases *ls, const ap_redis_lease *copy)
{
	char k[17];

	pthread_mutex_lock(&ls->mu);
	for (ap_lease *l = ls->held; l; l = l->next)
		if (!l->lost && !strcmp(l->l.token, copy->token)) {
			l->lost = true;
			ls->n[ix(l->l.kind)].lost++;
			key_label(copy->key, k);
			ap_log(AP_LOG_WARN, "cluster lease of %s... lapsed while held (this daemon "
			       "stalled for over %u ms, or Redis lost it): another daemon may compile it "
			       "too", k, ls->ttl_ms);
			break;
		}
	pthread_mutex_unlock(&ls->mu);
}

/* Renews a copy of every held lease (called without mu). */
static void renew_all(ap_leases *ls)
{
	ap_redis_lease *copy = NULL;
	size_t n = 0, i = 0;

	pthread_mutex_lock(&ls->mu);
	for (ap_lease *l = ls->held; l; l = l->next)
		n += !l->lost;
	if (n && (copy = malloc(n * sizeof(*copy))))
		for (ap_lease *l = ls->held; l && i < n; l = l->next)
			if (!l->lost)
				copy[i++] = l->l;
	pthread_mutex_unlock(&ls->mu);
	for (size_t k = 0; copy && k < i; k++)
		if (ap_redis_lease_renew(ls->r, &copy[k], ls->ttl_ms) == 0)
			mark_lost(ls, &copy[k]);
	free(copy);
}

/* The renewal thread: every ttl_ms / 3 until stopped. */
static void *keeper_main(void *arg)
{
	ap_leases *ls = arg;

	pthread_mutex_lock(&ls->mu);
	while (!ls->stop) {
		struct timespec ts;
		long long ns;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		ns = (long long)ts.tv_nsec + (long long)(ls->ttl_ms / 3) * 1000000LL;
		ts.tv_sec += (time_t)(ns / 1000000000LL);
		ts.tv_nsec = (long)(ns % 1000000000LL);
		pthread_cond_timedwait(&ls->cv, &ls->mu, &ts);
		if (ls->stop)
			break;
		pthread_mutex_unlock(&ls->mu);
		renew_all(ls);
		pthread_mutex_lock(&ls->mu);
	}
	pthread_mutex_unlock(&ls->mu);
	return NULL;
}

ap_leases *ap_leases_new(struct ap_redis *r, unsigned ttl_ms)
{
	ap_leases *ls;
	pthread_condattr_t ca;

	if (!r || ttl_ms < 3 || !(ls = calloc(1, sizeof(*ls))))
		return NULL;
	ls->r = r;
	ls->ttl_ms = ttl_ms;
	pthread_mutex_init(&ls->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&ls->cv, &ca);
	pthread_condattr_destroy(&ca);
	if (pthread_create(&ls->thread, NULL, keeper_main, ls)) {
		pthread_cond_destroy(&ls->cv);
		pthread_mutex_destroy(&ls->mu);
		free(ls);
		return NULL;
	}
	return ls;
}

ap_leases *ap_leases_free(ap_leases *ls)
{
	if (!ls)
		return NULL;
	pthread_mutex_lock(&ls->mu);
	ls->stop = true;
	pthread_cond_broadcast(&ls->cv);
	pthread_mutex_unlock(&ls->mu);
	pthread_join(ls->thread, NULL);
	while (ls->held) {
		ap_lease *l = ls->held;

		ls->held = l->next;
		free(l);
	}
	pthread_cond_destroy(&ls->cv);
	pthread_mutex_destroy(&ls->mu);
	free(ls);
	return NULL;
}

/* ---- claims ---------------------------------------------------------------------- */

/* Lease l was just taken (after a lapse: `over`): held and renewed from
 * now; then L2 is asked once more, since the entry may have been stored
 * (and its lease released) between the caller's miss and this take. */
static int hold(ap_leases *ls, ap_lease *l, bool over, bool (*found)(void *), void *user,
		ap_lease **out)
{
	pthread_mutex_lock(&ls->mu);
	l->next = ls->held;
	ls->held = l;
	ls->n[ix(l->l.kind)].taken++;
	ls->n[ix(l->l.kind)].taken_over += over;
	pthread_mutex_unlock(&ls->mu);
	if (found(user)) {
		ap_lease_release(ls, l);
		return AP_LEASE_FOUND;
	}
	*out = l;
	return AP_LEASE_HOLD;
}

/* Adds `lapsed` lapses to the counts of w's kind. */
static void count_lapses(ap_leases *ls, const ap_lease_wait *w, uint64_t lapsed)
{
	pthread_mutex_lock(&ls->mu);
	ls->n[ix(w->mine->l.kind)].lapsed += lapsed;
	pthread_mutex_unlock(&ls->mu);
}

/* One poll of a wait: the holder's token, then the entry.  Returns a
 * claim's outcome when the wait ends, AP_LEASE_WAIT to go on.  w->mine
 * (the token this daemon tried with) is taken over by hold() when the
 * wait ends holding it (w->mine set to NULL then). */
static int poll_once(ap_leases *ls, ap_lease_wait *w, bool (*found)(void *), void *user,
		     ap_lease **out)
{
	char tok[AP_REDIS_TOKEN_CHARS + 1];
	ap_lease *mine = w->mine;
	int rc = ap_redis_lease_holder(ls->r, mine->l.kind, mine->l.key, tok);

	if (rc < 0)
		return AP_LEASE_ALONE;   /* Redis went away: compile alone */
	if (rc == 1 && !strcmp(tok, mine->l.token)) {
		w->mine = NULL;          /* our own SET NX, its reply lost */
		return hold(ls, mine, false, found, user, out);
	}
	if (found(user))
		return AP_LEASE_FOUND;
	if (rc == 1) {
		/* another holder: the one before left no entry */
		if (w->held && w->seen[0] && tok[0] && strcmp(w->seen, tok))
			count_lapses(ls, w, 1);
		memcpy(w->seen, tok, sizeof(tok));
		w->held = true;
		return AP_LEASE_WAIT;
	}
	/* nobody holds it and there is no entry: the holder's lease lapsed */
	count_lapses(ls, w, w->held);
	w->held = false;
	w->seen[0] = '\0';
	rc = ap_redis_lease_take(ls->r, mine->l.kind, mine->l.key, ls->ttl_ms, &mine->l);
	if (rc < 0)
		return AP_LEASE_ALONE;
	if (rc == 0)
		return AP_LEASE_WAIT;    /* another waiter took it first: wait for it */
	{
		char k[17];

		key_label(mine->l.key, k);
		ap_log(AP_LOG_INFO, "cluster lease of %s %s... lapsed without its entry: this "
		       "daemon takes it over and compiles",
		       mine->l.kind == AP_REDIS_KERNEL ? "kernel" : "request", k);
	}
	w->mine = NULL;
	return hold(ls, mine, true, found, user, out);
}

int ap_lease_try(ap_leases *ls, int kind, const uint8_t key[32], bool (*found)(void *user),
		 void *user, ap_lease **out, ap_lease_wait **wait)
{
	ap_lease *l = calloc(1, sizeof(*l));
	ap_lease_wait *w;
	int rc;

	*out = NULL;
	*wait = NULL;
	if (!l)
		return AP_LEASE_ALONE;
	rc = ap_redis_lease_take(ls->r, kind, key, ls->ttl_ms, &l->l);
	if (rc == 1)
		return hold(ls, l, false, found, user, out);
	if (rc < 0 || !(w = calloc(1, sizeof(*w)))) {
		free(l);
		return AP_LEASE_ALONE;
	}
	w->mine = l;
	w->held = true;
	w->pause = POLL_FIRST_MS;
	pthread_mutex_lock(&ls->mu);
	ls->n[ix(kind)].waited++;
	ls->n[ix(kind)].waiting++;
	pthread_mutex_unlock(&ls->mu);
	*wait = w;
	return AP_LEASE_WAIT;
}

double ap_lease_pause(const ap_leases *ls, ap_lease_wait *w, double deadline_ms)
{
	double left = deadline_ms - ap_now_ms(), max = POLL_MAX_MS, p = w->pause;

	if (max > ls->ttl_ms / 4.0)
		max = ls->ttl_ms / 4.0 > 1 ? ls->ttl_ms / 4.0 : 1;
	w->pause = p * 2 < max ? p * 2 : max;
	if (p > max)
		p = max;
	return left <= 0 ? 0 : p < left ? p : left;
}

int ap_lease_poll(ap_leases *ls, ap_lease_wait *w, double deadline_ms, const atomic_bool *cancel,
		  bool (*found)(void *user), void *user, ap_lease **out)
{
	int kind = w->mine->l.kind, st = AP_LEASE_ALONE;

	*out = NULL;
	if (!(cancel && atomic_load(cancel)))
		st = poll_once(ls, w, found, user, out);
	if (st == AP_LEASE_WAIT && ap_now_ms() < deadline_ms)
		return AP_LEASE_WAIT;
	pthread_mutex_lock(&ls->mu);
	if (st == AP_LEASE_WAIT) {
		char k[17];

		key_label(w->mine->l.key, k);
		ap_log(AP_LOG_INFO, "cluster lease of %s %s... still held at the end of "
		       "flight_wait_ms: compiling it here too",
		       kind == AP_REDIS_KERNEL ? "kernel" : "request", k);
		ls->n[ix(kind)].timeouts++;
		st = AP_LEASE_ALONE;
	}
	ls->n[ix(kind)].waiting--;
	pthread_mutex_unlock(&ls->mu);
	free(w->mine);
	free(w);
	return st;
}

int ap_lease_await(ap_leases *ls, ap_lease_wait *w, double deadline_ms, const atomic_bool *cancel,
		  bool (*found)(void *user), void *user, ap_lease **out)
{
	int st;

	do {
		ap_lease_sleep(ap_lease_pause(ls, w, deadline_ms));
		st = ap_lease_poll(ls, w, deadline_ms, cancel, found, user, out);
	} while (st == AP_LEASE_WAIT);
	return st;
}

int ap_lease_claim(ap_leases *ls, int kind, const uint8_t key[32], double deadline_ms,
		   const atomic_bool *cancel, bool (*found)(void *user), void *user, ap_lease **out)
{
	ap_lease_wait *w;
	int st = ap_lease_try(ls, kind, key, found, user, out, &w);

	return st == AP_LEASE_WAIT ? ap_lease_await(ls, w, deadline_ms, cancel, found, user, out) : st;
}

void ap_lease_release(ap_leases *ls, ap_lease *l)
{
	ap_lease **pp;

	if (!l)
		return;
	pthread_mutex_lock(&ls->mu);
	for (pp = &ls->held; *pp && *pp != l; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = l->next;
	pthread_mutex_unlock(&ls->mu);
	ap_redis_lease_release(ls->r, &l->l);
	free(l);
}

void ap_leases_get_counts(ap_leases *ls, int kind, ap_lease_counts *out)
{
	memset(out, 0, sizeof(*out));
	if (!ls)
		return;
	pthread_mutex_lock(&ls->mu);
	*out = ls->n[ix(kind)];
	pthread_mutex_unlock(&ls->mu);
}

/* lease.h -- one compile per cold graph, and per cold kernel, across the
 * cluster (issue 26, item 1): the lease a daemon takes in the shared
 * cache (Redis) before compiling a request or a kernel, and the wait of
 * the daemons that find it held.
 *
 * Single-flight (flight.h) makes identical requests within one daemon
 * compile once; when a training job starts on many nodes at once every
 * daemon still misses L2 for the same graph in the same second.  So the
 * leader of a request flight that missed L1 and L2 claims the graph key's
 * lease (redis.h, ap_redis_lease_take: SET NX PX with a random token):
 *
 *  - taken: it looks in L2 once more (an entry stored and its lease
 *    released between the miss and the take), then compiles holding the
 *    lease; a renewal thread extends every lease held to ttl_ms from now
 *    each ttl_ms / 3 (compare-and-PEXPIRE), and the holder releases it
 *    (compare-and-DEL) once its entry is stored in L2, or when it failed;
 *  - held by another daemon: it waits, polling with a bounded back-off
 *    (POLL_FIRST_MS doubling up to POLL_MAX_MS, at most ttl_ms / 4) for
 *    the holder's token and for the entry, until the caller's deadline
 *    (flight_wait_ms from the request's arrival): the entry appearing
 *    ends the wait (answered from L2); the lease gone without an entry --
 *    the holder died (SIGKILL, a lost node) and its lease lapsed after
 *    ttl_ms, or it failed and released it -- counts a lapse, and the
 *    waiter takes the lease (SET NX) and compiles, unless another waiter
 *    took it first (then it waits for that one, a new holder counted as a
 *    lapse too); the deadline passing, it compiles alone;
 *  - Redis unreachable, timing out or its breaker open: compile alone at
 *    once, as without a shared cache (the take costs at most the Redis
 *    command timeout; a failing poll ends the wait the same way).
 *
 * A holder that stalls longer than ttl_ms loses its lease (counted, and
 * logged when its renewal finds another token); it still finishes and
 * stores, and its release then leaves the new holder's lease alone.
 *
 * Kernels (server/compile/kernels.c) take leases of kind AP_REDIS_KERNEL
 * by the same rules, keyed by the kernel key and counted apart; since a
 * request may wait for several kernels and must not sleep holding a lease
 * of its own, it takes them with ap_lease_try and, once it has compiled
 * and released its own, polls the waits together (ap_lease_pause,
 * ap_lease_poll).
 *
 * Thread safety: every function may be called from any thread; one mutex
 * guards the list of held leases and the counts.  Redis calls are made
 * outside it.
 */
#ifndef AP_COMPILE_LEASE_H
#define AP_COMPILE_LEASE_H

#include <stdatomic.h>

#include "../../common/base.h"

struct ap_redis;

typedef struct ap_leases ap_leases;
typedef struct ap_lease ap_lease;

/* The leases of one daemon on Redis `r` (borrowed; must outlive them),
 * each taken for `ttl_ms` (>= 3) and renewed every ttl_ms / 3 by a
 * thread started here.  NULL when out of memory or no thread starts. */
__ap_give ap_leases *ap_leases_new(__ap_keep struct ap_redis *r, unsigned ttl_ms);
/* Stops the renewal thread and frees; leases still held are left to
 * lapse (and are freed).  Accepts NULL, returns NULL. */
ap_leases *ap_leases_free(__ap_take ap_leases *ls);

enum { AP_LEASE_HOLD = 1, AP_LEASE_FOUND = 2, AP_LEASE_ALONE = 3, AP_LEASE_WAIT = 4 };

/* Claims the lease of `key` of `kind` (AP_REDIS_ACTION: a request's
 * graph key; AP_REDIS_KERNEL: a kernel's key, counted apart), waiting as
 * the file comment says until `deadline_ms` (ap_now_ms() clock) or
 * `cancel` (NULL: never) is set.  found(user) looks for the entry in L2
 * (true: the caller has its answer); it is called after the take and at
 * each poll.  AP_LEASE_HOLD: compile holding *out, then give it back with
 * ap_lease_release; AP_LEASE_FOUND: found() answered; AP_LEASE_ALONE:
 * compile without a lease (Redis unavailable, the deadline passed,
 * cancelled, out of memory).  Never fails otherwise.  The same as
 * ap_lease_try, then ap_lease_await. */
int ap_lease_claim(ap_leases *ls, int kind, const uint8_t key[32], double deadline_ms,
		   const atomic_bool *cancel, bool (*found)(void *user), void *user,
		   __ap_give ap_lease **out);

/* ---- a claim in steps: several waits polled by one thread ------------------------
 *
 * A caller that waits for several leases at once (the kernels of one
 * request, compile.c) takes each without waiting, then polls the waits
 * round by round, sleeping once per round; it must hold no lease of its
 * own while it sleeps (the file comment of server/compile/kernels.c says
 * why: no two daemons ever wait for each other). */
typedef struct ap_lease_wait ap_lease_wait;

/* Tries once to take the lease of `key` of `kind`, as ap_lease_claim
 * does but without waiting: AP_LEASE_HOLD (*out), AP_LEASE_FOUND,
 * AP_LEASE_ALONE as there, or AP_LEASE_WAIT: another daemon holds it, and
 * *wait (freed by the call of ap_lease_poll that ends it) is the wait to
 * poll; counted as waited on. */
int ap_lease_try(ap_leases *ls, int kind, const uint8_t key[32], bool (*found)(void *user),
		 void *user, __ap_give ap_lease **out, __ap_give ap_lease_wait **wait);
/* How long to sleep before polling `w` again, in ms: its back-off
 * (POLL_FIRST_MS doubling up to POLL_MAX_MS, at most ttl_ms / 4), which
 * this call advances, and no later than `deadline_ms`; 0 once it passed. */
double ap_lease_pause(const ap_leases *ls, ap_lease_wait *w, double deadline_ms);
/* Sleeps `ms` milliseconds (nothing when <= 0). */
void ap_lease_sleep(double ms);
/* Polls wait `w` (ap_lease_pause, ap_lease_poll) until it ends; the
 * outcome is ap_lease_poll's, never AP_LEASE_WAIT. */
int ap_lease_await(ap_leases *ls, __ap_take ap_lease_wait *w, double deadline_ms,
		  const atomic_bool *cancel, bool (*found)(void *user), void *user,
		  __ap_give ap_lease **out);
/* One poll of wait `w`: AP_LEASE_WAIT while another daemon still holds
 * the lease (sleep ap_lease_pause, poll again); otherwise the wait has
 * ended and `w` is freed: AP_LEASE_FOUND (found() answered),
 * AP_LEASE_HOLD (the holder lapsed and this daemon took the lease over:
 * *out), AP_LEASE_ALONE (Redis gone, `cancel` set, or `deadline_ms`
 * passed: counted as a timeout). */
int ap_lease_poll(ap_leases *ls, __ap_take ap_lease_wait *w, double deadline_ms,
		  const atomic_bool *cancel, bool (*found)(void *user), void *user,
		  __ap_give ap_lease **out);

/* The holder is done (its entry stored, or it failed): stops renewing
 * and deletes the lease in Redis if its token still holds it.  Accepts
 * NULL. */
void ap_lease_release(ap_leases *ls, __ap_take ap_lease *l);

/* Totals since creation, of leases of `kind` (AP_REDIS_ACTION: requests,
 * docs/cluster.md's apollo_cluster_leases_total; AP_REDIS_KERNEL:
 * kernels, apollo_cluster_kernel_leases_total). */
typedef struct ap_lease_counts {
	uint64_t taken;        /* leases this daemon took (take-overs included) */
	uint64_t waited;       /* claims that found the lease held and waited */
	uint64_t lapsed;       /* during those waits, holders whose lease went
				  without their entry (expired or released on
				  failure) */
	uint64_t taken_over;   /* of the leases taken, those taken after a lapse */
	uint64_t timeouts;     /* waits that reached their deadline (compiled alone) */
	uint64_t lost;         /* leases whose renewal found them gone or another's */
	uint64_t waiting;      /* claims waiting now */
} ap_lease_counts;
void ap_leases_get_counts(ap_leases *ls, int kind, ap_lease_counts *out);

#endif

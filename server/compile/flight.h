/* flight.h -- single-flight: of several identical pieces of work in flight
 * at once (the same 32-byte cache key), one is done and the others wait for
 * its result.
 *
 * The compile job uses two tables (compile.c): whole requests by graph key
 * (eight clients submitting one cold graph compile it once) and kernels by
 * kernel key (two different graphs needing one missing kernel compile it
 * once).  The first caller for a key leads: it does the work and publishes
 * the outcome, bytes or an error, with ap_flight_finish.  Callers that come
 * while it works follow: ap_flight_wait blocks until the outcome is
 * published or the follower's own deadline passes; each follower gets its
 * own copy.  The entry leaves the table when the leader finishes, so a
 * caller arriving later leads a new flight (by then the outcome is in the
 * cache, which the caller looks at first).
 *
 * A leader never waits on a flight while it leads one (the work it leads is
 * a whole compile or one backend call), so waiting cannot deadlock.
 *
 * Thread safety: every function may be called from any thread; one mutex
 * per table.
 */
#ifndef AP_COMPILE_FLIGHT_H
#define AP_COMPILE_FLIGHT_H

#include "../../common/base.h"

typedef struct ap_flights ap_flights;
typedef struct ap_flight ap_flight;

/* An empty table; NULL when out of memory. */
__ap_give ap_flights *ap_flights_new(void);
/* Frees the table; no flight may be under way.  Accepts NULL, returns NULL. */
ap_flights *ap_flights_free(__ap_take ap_flights *t);

enum { AP_FLIGHT_LEAD = 1, AP_FLIGHT_FOLLOW = 2 };

/* Joins the flight for `key`: AP_FLIGHT_LEAD (the caller does the work and
 * must call ap_flight_finish with *f) or AP_FLIGHT_FOLLOW (the caller must
 * call ap_flight_wait with *f); AP_ENOMEM (no flight: work alone). */
int ap_flight_join(ap_flights *t, const uint8_t key[32], __ap_give ap_flight **f);

/* The leader's outcome: rc 0 with `len` bytes at `data` (taken: owned by
 * the flight from now on, freed with it), or a negative rc with `err`
 * (copied; may be NULL) and data NULL.  Wakes every follower, removes the
 * flight from the table and drops the leader's reference. */
void ap_flight_finish(ap_flights *t, __ap_take ap_flight *f, int rc, const ap_error *err,
		      __ap_take uint8_t *data, size_t len);

/* A follower waits until the outcome is published or `deadline_ms`
 * (ap_now_ms() clock, milliseconds) passes.  1: published, with *rc, `err`
 * (when not NULL) and, for rc 0, a copy of the bytes (*data malloc'd,
 * caller frees; NULL with *rc AP_ENOMEM when the copy cannot be made);
 * 0: the deadline passed first.  Drops the follower's reference either
 * way. */
int ap_flight_wait(ap_flights *t, __ap_take ap_flight *f, double deadline_ms, int *rc,
		   ap_error *err, __ap_give uint8_t **data, size_t *len);

/* Totals since the table was created. */
typedef struct ap_flight_counts {
	uint64_t led;        /* flights led (the work was done) */
	uint64_t followed;   /* followers answered by a leader's outcome */
	uint64_t timeouts;   /* followers whose deadline passed first */
	uint64_t waiting;    /* followers waiting now */
} ap_flight_counts;
void ap_flights_get_counts(ap_flights *t, ap_flight_counts *out);

#endif

/* flight.c -- single-flight tables (see flight.h).
 *
 * Approach: a chained hash table of flights keyed by the first 8 bytes of
 * the key (keys are SHA-256 values), under one mutex, each flight with its
 * own condition variable on the monotonic clock (the ap_now_ms clock, so
 * deadlines do not move with the wall clock).  A flight is reference
 * counted: the leader and each follower hold one; the outcome is written
 * once, under the mutex, and read by followers after they see `done`, so
 * they copy it without the lock.
 */
#include "flight.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BUCKETS 256

struct ap_flight {
	uint8_t key[32];
	int refs;
	bool done;
	int rc;
	ap_error err;
	uint8_t *data;
	size_t len;
	pthread_cond_t cv;
	ap_flight *next;        /* in the bucket, while in the table */
};

struct ap_flights {
	pthread_mutex_t mu;
	ap_flight *buckets[BUCKETS];
	uint64_t led, followed, timeouts, waiting;
};

static unsigned bucket_of(const uint8_t key[32])
{
	uint64_t x;

	memcpy(&x, key, sizeof(x));
	return (unsigned)(x % BUCKETS);
}

ap_flights *ap_flights_new(void)
{
	ap_flights *t = calloc(1, sizeof(*t));

	if (t)
		pthread_mutex_init(&t->mu, NULL);
	return t;
}

ap_flights *ap_flights_free(ap_flights *t)
{
	if (!t)
		return NULL;
	pthread_mutex_destroy(&t->mu);
	free(t);
	return NULL;
}

/* Under mu: drops one reference, freeing the flight with the last. */
static void unref(ap_flight *f)
{
	if (--f->refs > 0)
		return;
	pthread_cond_destroy(&f->cv);
	free(f->data);
	free(f);
}

int ap_flight_join(ap_flights *t, const uint8_t key[32], ap_flight **out)
{
	pthread_condattr_t ca;
	ap_flight *f;
	unsigned b = bucket_of(key);

	*out = NULL;
	pthread_mutex_lock(&t->mu);
	for (f = t->buckets[b]; f; f = f->next) {
		if (!memcmp(f->key, key, 32)) {
			f->refs++;
			t->waiting++;
			pthread_mutex_unlock(&t->mu);
			*out = f;
			return AP_FLIGHT_FOLLOW;
		}
	}
	f = calloc(1, sizeof(*f));
	if (!f) {
		pthread_mutex_unlock(&t->mu);
		return AP_ENOMEM;
	}
	memcpy(f->key, key, 32);
	f->refs = 1;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&f->cv, &ca);
	pthread_condattr_destroy(&ca);
	f->next = t->buckets[b];
	t->buckets[b] = f;
	t->led++;
	pthread_mutex_unlock(&t->mu);
	*out = f;
	return AP_FLIGHT_LEAD;
}

void ap_flight_finish(ap_flights *t, ap_flight *f, int rc, const ap_error *err, uint8_t *data,
		      size_t len)
{
	ap_flight **pp;

	pthread_mutex_lock(&t->mu);
	for (pp = &t->buckets[bucket_of(f->key)]; *pp && *pp != f; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = f->next;
	f->next = NULL;
	f->rc = rc;
	if (err)
		f->err = *err;
	else
		ap_error_clear(&f->err);
	f->data = rc ? NULL : data;
	f->len = rc ? 0 : len;
	if (rc)
		free(data);
	f->done = true;
	pthread_cond_broadcast(&f->cv);
	unref(f);
	pthread_mutex_unlock(&t->mu);
}

int ap_flight_wait(ap_flights *t, ap_flight *f, double deadline_ms, int *rc, ap_error *err,
		   uint8_t **data, size_t *len)
{
	int got;

	*data = NULL;
	*len = 0;
	pthread_mutex_lock(&t->mu);
	while (!f->done) {
		double left = deadline_ms - ap_now_ms();
		struct timespec ts;

		if (left <= 0)
			break;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += (time_t)(left / 1e3);
		ts.tv_nsec += (long)((left - (double)(long long)(left / 1e3) * 1e3) * 1e6);
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&f->cv, &t->mu, &ts);
	}
	got = f->done;
	t->waiting--;
	if (got)
		t->followed++;
	else
		t->timeouts++;
	pthread_mutex_unlock(&t->mu);
	if (got) {
		/* done: the outcome no longer changes; f is kept by our reference */
		*rc = f->rc;
		if (err)
			*err = f->err;
		if (f->rc == 0) {
			*data = malloc(f->len ? f->len : 1);
			if (*data) {
				memcpy(*data, f->data, f->len);
				*len = f->len;
			} else {
				*rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
			}
		}
	}
	pthread_mutex_lock(&t->mu);
	unref(f);
	pthread_mutex_unlock(&t->mu);
	return got;
}

void ap_flights_get_counts(ap_flights *t, ap_flight_counts *out)
{
	memset(out, 0, sizeof(*out));
	if (!t)
		return;
	pthread_mutex_lock(&t->mu);
	out->led = t->led;
	out->followed = t->followed;
	out->timeouts = t->timeouts;
	out->waiting = t->waiting;
	pthread_mutex_unlock(&t->mu);
}

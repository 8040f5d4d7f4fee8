/* kernel_timer.c -- the client runtime as the daemon's kernel timer
 * (common/kernel_timer.h): the background tuner times candidates through
 * this, so that the server library links no runtime of its own. */
#include "../common/kernel_timer.h"

#include "proto/apollo.pb-c.h"
#include "runtime.h"

struct relay {
	ap_kernel_timed_fn fn;
	void *user;
};

static int relay_timed(void *user, const ap_bundle_launch_part *pt, double median_us, unsigned runs)
{
	const struct relay *r = user;

	return r->fn(r->user, pt->tune_signature, pt->schedule, median_us, runs);
}

static int time_tuned(Apollo__Bundle *pb, int device, int warmup, int runs, char *device_name,
		      size_t cap, unsigned *sms, ap_kernel_timed_fn fn, void *user, ap_error *err)
{
	struct relay r = { fn, user };
	ap_bundle *b = ap_bundle_from_pb(pb);
	int rc;

	if (!b)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	rc = ap_runtime_time_tuned(b, NULL, device, warmup, runs, device_name, cap, sms, relay_timed, &r,
				   err);
	ap_bundle_free(b);
	return rc;
}

const ap_kernel_timer ap_runtime_kernel_timer = { ap_runtime_cuda_available, time_tuned };

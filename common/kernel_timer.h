/* kernel_timer.h -- timing a bundle's tuned kernels on this host's GPU,
 * behind an interface: the daemon's background tuner
 * (server/compile/autotune.c) calls it, the client runtime implements it
 * (ap_runtime_kernel_timer, client/kernel_timer.c), and apollod wires the
 * one into the other (server/main.c), so that the server library does not
 * link the client's runtime (issue 28, the architecture review's item 2).
 * A test may wire a fake.
 */
#ifndef AP_KERNEL_TIMER_H
#define AP_KERNEL_TIMER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base.h"

struct Apollo__Bundle;

/* One timed candidate: the tuning signature (32 bytes) and schedule
 * ("knob=value ...") of the launch part that ran alone in its launch, both
 * borrowed for the call; the median of its timed runs in microseconds and
 * how many runs were timed.  Returns 0, or a negative AP_E* to stop. */
typedef int (*ap_kernel_timed_fn)(void *user, const uint8_t *tune_signature, const char *schedule,
				  double median_us, unsigned runs);

typedef struct ap_kernel_timer {
	/* Whether a CUDA driver with at least one device can be used here;
	 * when not, `why` (cap bytes, may be NULL) gets the reason. */
	bool (*available)(char *why, size_t cap);
	/* Takes the bundle `pb` (an apollo__bundle__unpack'ed message, freed
	 * here in every case; compiled with tune_variant, so each tuned
	 * kernel runs alone in its launch), loads it on CUDA
	 * device `device`, binds zeros to its inputs and parameters, runs the
	 * plan `warmup` times, then `runs` (>= 1) times timed (CUDA events),
	 * and calls fn once per launch running one part with a tuning
	 * signature.  `device_name` (cap bytes, may be NULL) gets the
	 * device's name and *sms its SM count.  0; fn's error; AP_EINVAL (a
	 * bundle the runtime refuses); AP_EUNSUPPORTED (no driver or
	 * device); AP_ECOMPILE (a blob the device does not load); AP_EIO (a
	 * launch failed); AP_ENOMEM -- with `err` set. */
	int (*time_tuned)(__ap_take struct Apollo__Bundle *pb, int device, int warmup, int runs,
			  char *device_name, size_t cap, unsigned *sms, ap_kernel_timed_fn fn, void *user,
			  ap_error *err);
} ap_kernel_timer;

#endif

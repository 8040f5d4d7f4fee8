/* sweep.h -- how much of an emitter's parameter space a test runs
 * (APOLLO_SWEEP).
 *
 * A test that sweeps a space (tests/check_lower.c: every configuration of
 * a case's emitter, lowered, compiled for the host and run against the
 * reference) spends nearly all its time compiling and running the
 * configurations, and a space is the cross product of its knobs, so it
 * grows with every knob an emitter gains.  APOLLO_SWEEP says how many of
 * the configurations that build are compiled and run:
 *
 *   full       every one (make check-full, before a release);
 *   sample     (the default; make check, make check-fast) a deterministic
 *              sample: the emitter's default configuration, every
 *              AP_SWEEP_STRIDE-th configuration that builds (in the
 *              space's order, the first knob fastest), and, for every
 *              knob, each of its values -- the first and the last among
 *              them -- in at least one configuration run.  A test that
 *              sees every configuration that builds before it runs any
 *              (check_lower: ap_sweep_select) covers the values not yet
 *              run greedily, each time the configuration that runs the
 *              most of them (a knob of V values needs about V
 *              configurations, not one per value of every knob); one that
 *              decides as it goes (ap_sweep_take) takes the first
 *              configuration with a value not run yet;
 *   sample:K   the same with stride K (make check-asan: the host kernels
 *              are compiled by the unsanitised cc, ASan instruments only
 *              the emitters, which every configuration still drives).
 *
 * Every configuration is still lowered, verified and printed; only the
 * compile and the run are sampled.  The same environment gives the same
 * sample on every machine.
 */
#ifndef AP_TESTS_SWEEP_H
#define AP_TESTS_SWEEP_H

#include <check.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "server/lower/lower.h"

#define AP_SWEEP_STRIDE 10

typedef struct ap_sweep {
	int stride;                       /* 1: every configuration */
	int n_offered;                    /* configurations offered so far */
	bool run[AP_SPACE_MAX_KNOBS][AP_KNOB_MAX_VALUES];   /* a value of a knob already run */
} ap_sweep;

/* The stride $APOLLO_SWEEP asks for: 1 for "full", AP_SWEEP_STRIDE for
 * "sample" or unset, K for "sample:K"; anything else fails the test. */
static inline int ap_sweep_stride(void)
{
	const char *s = getenv("APOLLO_SWEEP");
	char *end;
	long k;

	if (!s || !*s || strcmp(s, "sample") == 0)
		return AP_SWEEP_STRIDE;
	if (strcmp(s, "full") == 0)
		return 1;
	ck_assert_msg(strncmp(s, "sample:", 7) == 0, "APOLLO_SWEEP=%s: full, sample or sample:K", s);
	k = strtol(s + 7, &end, 10);
	ck_assert_msg(*end == 0 && k >= 1 && k <= 1000, "APOLLO_SWEEP=%s: K from 1 to 1000", s);
	return (int)k;
}

static inline void ap_sweep_init(ap_sweep *sw)
{
	memset(sw, 0, sizeof(*sw));
	sw->stride = ap_sweep_stride();
}

/* Whether the configuration of sp that builds with knob values idx
 * (indices into sp's knobs) is compiled and run; is_default: it is the
 * emitter's default configuration.  Call once per configuration that
 * builds, in the space's order. */
static inline bool ap_sweep_take(ap_sweep *sw, const ap_space *sp, const int *idx, bool is_default)
{
	bool take = sw->stride <= 1 || is_default || sw->n_offered % sw->stride == 0;

	for (int i = 0; i < sp->n && !take; i++)
		take = !sw->run[i][idx[i]];
	sw->n_offered++;
	for (int i = 0; take && i < sp->n; i++)
		sw->run[i][idx[i]] = true;
	return take;
}

/* The offline form of the sample: of the n configurations of sp that
 * build, cfg[c] their knob indices in the space's order and `dflt` the
 * default's position (-1: none builds), sets take[c] for those compiled
 * and run and returns how many: with stride 1 all; else the default, every
 * stride-th, then, while a value of a knob that some configuration builds
 * with has not run, the configuration that runs the most such values (the
 * first of equals) -- the greedy set cover (Chvatal 1979).  The same
 * inputs give the same selection. */
static inline int ap_sweep_select(int stride, const ap_space *sp, const int (*cfg)[AP_SPACE_MAX_KNOBS],
				  int n, int dflt, bool *take)
{
	bool run[AP_SPACE_MAX_KNOBS][AP_KNOB_MAX_VALUES] = {{false}};
	int n_take = 0;

	for (int c = 0; c < n; c++) {
		take[c] = stride <= 1 || c == dflt || c % stride == 0;
		n_take += take[c];
		for (int i = 0; take[c] && i < sp->n; i++)
			run[i][cfg[c][i]] = true;
	}
	for (;;) {
		int best = -1, best_new = 0;

		for (int c = 0; c < n; c++) {
			int fresh = 0;

			for (int i = 0; !take[c] && i < sp->n; i++)
				fresh += !run[i][cfg[c][i]];
			if (fresh > best_new) {
				best = c;
				best_new = fresh;
			}
		}
		if (best < 0)
			return n_take;
		take[best] = true;
		n_take++;
		for (int i = 0; i < sp->n; i++)
			run[i][cfg[best][i]] = true;
	}
}

#endif

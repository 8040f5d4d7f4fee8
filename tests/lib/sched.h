/* sched.h -- a test's schedule: an emitter's default with one knob set.
 *
 * Tests that lower a form the default rule does not choose (tma=1 today:
 * check_hostcheck's TMA GEMM, check_lower's wgmma golden) start from the
 * default schedule of the product's emitter (ap_emitter_default) and set
 * one knob by name; the schedule must still be valid for the product
 * (ap_sched_valid), and the default must have chosen `dflt` for it, so
 * that the test sees the default rule it expects.
 */
#ifndef APOLLO_TESTS_LIB_SCHED_H
#define APOLLO_TESTS_LIB_SCHED_H

#include <check.h>
#include <stdbool.h>
#include <string.h>

#include "server/lower/lower.h"

/* Whether the space of m's first emitter on ti has knob `knob`. */
static inline bool ap_test_space_has(const ap_mgraph *m, const ap_target_info *ti, const char *knob)
{
	ap_bound b;
	ap_space sp;
	ap_sched s;
	ap_error err;
	bool has = false;

	ck_assert_int_eq(ap_bind_first(m, ti, &b, &err), 0);
	ck_assert_int_eq(ap_emitter_default(&b, &sp, &s, &err), 0);
	for (int i = 0; i < sp.n; i++)
		has |= !strcmp(sp.knobs[i].name, knob);
	ap_unbind(&b);
	return has;
}

/* Fills *s with the default schedule of m on ti (m bound by its first
 * emitter) with knob `knob` set to `value`; fails the test when the knob
 * is absent, the default's value is not `dflt`, or the result is not
 * valid. */
static inline void ap_test_default_with(const ap_mgraph *m, const ap_target_info *ti, const char *knob,
					int dflt, int value, ap_sched *s)
{
	ap_bound b;
	ap_space sp;
	ap_error err;
	int at = -1;

	ck_assert_int_eq(ap_bind_first(m, ti, &b, &err), 0);
	ck_assert_int_eq(ap_emitter_default(&b, &sp, s, &err), 0);
	for (int i = 0; i < sp.n; i++)
		if (!strcmp(sp.knobs[i].name, knob))
			at = i;
	ck_assert_msg(at >= 0, "no %s knob for this product", knob);
	ck_assert_int_eq(s->v[at], dflt);
	s->v[at] = value;
	ck_assert_int_eq(ap_sched_valid(&b, s), 1);
	ap_unbind(&b);
}

/* Sets knob `knob` of schedule *s (of m's first emitter on ti) to
 * `value`; fails the test when the knob is absent or the result is not
 * valid. */
static inline void ap_test_set_knob(const ap_mgraph *m, const ap_target_info *ti, const char *knob, int value,
				    ap_sched *s)
{
	ap_bound b;
	ap_space sp;
	ap_sched d;
	ap_error err;
	int at = -1;

	ck_assert_int_eq(ap_bind_first(m, ti, &b, &err), 0);
	ck_assert_int_eq(ap_emitter_default(&b, &sp, &d, &err), 0);
	for (int i = 0; i < sp.n; i++)
		if (!strcmp(sp.knobs[i].name, knob))
			at = i;
	ck_assert_msg(at >= 0, "no %s knob for this product", knob);
	s->v[at] = value;
	ck_assert_int_eq(ap_sched_valid(&b, s), 1);
	ap_unbind(&b);
}

#endif

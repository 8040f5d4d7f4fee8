/* require.h -- what a test does when the machine lacks something it needs.
 *
 * Some checks need more than the build: the host C compiler ("cc"),
 * NVRTC and its headers ("nvrtc"), ../shared/testdata ("testdata"), the
 * stand-in CUDA driver that `make all` builds ("standin"), a CUDA device
 * ("gpu"); the scripts also know a headless Chromium ("browser",
 * tests/explain_html.sh) and PyTorch in .venv ("torch", the same script's
 * torch part).  Where one is missing the check prints why and passes without
 * doing its work (a developer's machine without NVRTC still runs the
 * rest).  $APOLLO_REQUIRE, a list of those names separated by commas
 * (.ci/run: APOLLO_REQUIRE=nvrtc,testdata,cc,standin), turns each such
 * skip of a named requirement into a failure, so that a CI image without
 * NVRTC or the test data cannot pass by skipping.  The scripts' side is
 * tests/lib/require.sh, the same names.
 */
#ifndef AP_TESTS_REQUIRE_H
#define AP_TESTS_REQUIRE_H

#include <check.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether $APOLLO_REQUIRE names `what` ("nvrtc", ...). */
static inline bool ap_test_required(const char *what)
{
	const char *s = getenv("APOLLO_REQUIRE");
	size_t n = strlen(what);

	while (s && *s) {
		size_t len = strcspn(s, ", ");

		if (len == n && strncmp(s, what, n) == 0)
			return true;
		s += len;
		s += strspn(s, ", ");
	}
	return false;
}

/* printf into buf (cut at cap bytes); returns buf. */
static inline __attribute__((format(printf, 3, 4))) const char *ap_test_format(char *buf, size_t cap,
									       const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, cap, fmt, ap);
	va_end(ap);
	return buf;
}

/* A check cannot do its work for want of `what`: prints the message
 * (printf's arguments) and goes on -- the caller then returns -- or, when
 * $APOLLO_REQUIRE names `what`, fails the test there with the message. */
#define AP_SKIP(what, ...)                                                                         \
	do {                                                                                       \
		char ap_skip_msg_[1024];                                                           \
		ap_test_format(ap_skip_msg_, sizeof(ap_skip_msg_), __VA_ARGS__);                   \
		ck_assert_msg(!ap_test_required(what), "%s (APOLLO_REQUIRE names %s)", ap_skip_msg_, \
			      what);                                                               \
		printf("%s\n", ap_skip_msg_);                                                      \
	} while (0)

#endif

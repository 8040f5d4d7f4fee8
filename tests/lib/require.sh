# require.sh -- sourced by the test scripts (through tests/daemon.inc, or
# directly): the shell side of tests/lib/require.h.
#
#   ap_skip WHAT MESSAGE   a check cannot run for want of WHAT (cc, nvrtc,
#                          testdata, standin, gpu, browser: a headless
#                          Chromium, torch): prints MESSAGE and
#                          returns 0, or, when $APOLLO_REQUIRE (names
#                          separated by commas) names WHAT, prints that it
#                          is required and returns 1.
# A script that skips whole ends with `ap_skip ...; exit $?`; one that
# skips a part, `ap_skip ... || status=1`.
ap_required() {
	case ",$(printf '%s' "${APOLLO_REQUIRE:-}" | tr ' ' ,)," in
	*",$1,"*) return 0 ;;
	esac
	return 1
}

ap_skip() {
	if ap_required "$1"; then
		echo "$2"
		echo "FAILED: APOLLO_REQUIRE names $1, so this may not be skipped"
		return 1
	fi
	echo "$2"
	return 0
}

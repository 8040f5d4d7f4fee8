#!/bin/sh
# layering.sh -- the libraries depend one way (docs/design.md): common/
# uses neither the server nor the client; the server (libapserver.a) and
# the client (libapollo-client.a) use common/ and not each other.  Read
# from the archives' symbol tables (nm): a global symbol one library
# defines must not be undefined (used) in a library that may not depend on
# it.  The daemon's kernel timing reaches the client runtime only through
# the interface apollod wires in (common/kernel_timer.h).
cd "$(dirname "$0")/.." || exit 1
B=${APOLLO_BUILD:-build}
fail=0
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
defined() { nm -g --defined-only "$B/$1" 2>/dev/null | awk 'NF == 3 { print $3 }' | sort -u; }
used() { nm -u "$B/$1" 2>/dev/null | awk 'NF == 2 { print $2 }' | sort -u; }
for a in libapcommon.a libapserver.a libapollo-client.a; do
	[ -f "$B/$a" ] || { echo "layering: missing $B/$a (make all)"; exit 1; }
done
# user library, then the libraries it may not use
for rule in "libapcommon.a libapserver.a libapollo-client.a" \
	    "libapserver.a libapollo-client.a" \
	    "libapollo-client.a libapserver.a"; do
	set -- $rule
	user=$1
	shift
	for lib in "$@"; do
		defined "$lib" >"$tmp"
		bad=$(used "$user" | comm -12 - "$tmp")
		if [ -n "$bad" ]; then
			echo "layering: FAILED: $user uses symbols of $lib:" $bad
			fail=1
		else
			echo "layering: $user uses nothing of $lib"
		fi
	done
done
[ $fail -eq 0 ] && echo "layering: PASS"
exit $fail

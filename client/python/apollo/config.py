"""config.py -- checks of the configuration a caller gives, shared by
apollo.compile and the torch.compile backend: the target's form, the
fusion level, option names; each failure is a message that says what the
valid forms are and, for a near miss ("sm90", "tagret"), what was probably
meant.  Parsers raise ValueError with that message; the callers turn it
into apollo.ConfigError.

No torch, no numpy: imported by the package itself.
"""
import difflib
import re

TARGET_FORMS = "cpu, sm_XX or sm_XXa (sm_90, sm_90a), compute_XX (compute_80), host:sm_XX"
FUSION_LEVELS = ("none", "rules", "apollo")

_TARGET_RE = re.compile(r"^(cpu|(host:)?sm_[0-9]+a?|compute_[0-9]+)$")
# Near misses of a GPU target: another case, no underscore or another
# separator ("sm90", "SM-90", "compute 80", "host:sm90").
_NEAR_GPU = re.compile(r"^(host:)?(sm|compute)[-_ .]?([0-9]+)(a?)$", re.IGNORECASE)
_HOST_WORDS = ("host", "cpu", "x86", "x86_64", "amd64", "aarch64", "arm64")


def suggest(word, choices):
    """' (did you mean X?)' for the closest of `choices`, or ''."""
    near = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return " (did you mean %s?)" % near[0] if near else ""


def _target_hint(v):
    m = _NEAR_GPU.match(v.strip())
    if m:
        host, kind, num, a = m.group(1) or "", m.group(2).lower(), m.group(3), m.group(4).lower()
        if kind == "compute":
            a = ""      # compute_XX has no 'a' form
        return " (did you mean %s%s_%s%s?)" % (host.lower(), kind, num, a)
    if v.strip().lower() in _HOST_WORDS:
        return " (did you mean cpu?)"
    if v.strip().lower() in ("cuda", "gpu", "nvidia"):
        return " (name the GPU's architecture, e.g. sm_90 for an H100, sm_80 for an A100)"
    return ""


def parse_target(v):
    """A target as the daemon spells it; ValueError with the valid forms and
    a suggestion for anything else.  Which targets the daemon has is
    checked once it is reached (check_target_listed)."""
    if not isinstance(v, str):
        raise ValueError("expected a target string (%s), not %s" % (TARGET_FORMS, type(v).__name__))
    if not _TARGET_RE.match(v):
        raise ValueError("unknown target %r: valid forms are %s%s" % (v, TARGET_FORMS, _target_hint(v)))
    return v


def parse_fusion(v):
    """None (the daemon's default) or one of FUSION_LEVELS."""
    if v is None:
        return None
    if not isinstance(v, str):
        raise ValueError("unknown fusion level %r (none, rules, apollo)" % (v,))
    if v not in ("",) + FUSION_LEVELS:
        raise ValueError("unknown fusion level %r (none, rules, apollo)%s"
                         % (v, suggest(v.lower(), FUSION_LEVELS)))
    return v or None


def unknown_options(given, known, what="apollo option"):
    """The message for option names in `given` that are not in `known`
    (with a suggestion for each near miss), or None when all are known."""
    unknown = sorted(set(map(str, given)) - set(known))
    if not unknown:
        return None
    return "unknown %s(s): %s (known: %s)" % (
        what, ", ".join("%s%s" % (u, suggest(u, known)) for u in unknown), ", ".join(sorted(known)))


def target_listed(target, listed):
    """None when the daemon, listing `listed`, has `target` (host:sm_XX:
    sm_XX emulated on the host); else the message."""
    t = target[len("host:"):] if target.startswith("host:") else target
    if t in listed:
        return None
    return "target %r: the daemon has no such target (it has %s)" % (target, ", ".join(listed))

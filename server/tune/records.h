/* records.h -- tuning records across the cache tiers (issue 28, item 3):
 * their key and value in the shared cache (L2), the lookup order a build
 * uses, and their writes to the local cache (L1, cache.h's tuning table)
 * and L2, through cache/tiers.h.
 *
 * A record (cache.h's ap_tune_record) is one tuning result of a kernel
 * signature (ap_tune_signature) on a target: the cost model's (one per
 * kernel and target, device "") or a measured one (one per kernel, target
 * and device "NAME|SMS": agreed on by two clients of some node, or
 * measured by a node's own tuner).  In L2 (kind 't'), keyed by SHA-256
 * over (a version tag, signature, target, measured or not, and a measured
 * record's device), its value is six parts: emitter, config, method,
 * device, candidates, then "sms modelled_us measured_us tried" as text.
 * A value read back is checked (printable strings within their bounds,
 * finite numbers, measured or not as its key says, a measured record's
 * device the one asked for) and otherwise ignored, with a warning.
 *
 * Thread safety: as the tiers (any thread).
 */
#ifndef AP_TUNE_RECORDS_H
#define AP_TUNE_RECORDS_H

#include "../cache/cache.h"
#include "../cache/tiers.h"

/* The record a build of `target` uses for kernel `sig`: `device`'s
 * measured record (L1, else L2, copied into L1), else the cost model's (L1,
 * else L2, copied into L1).  With `device` NULL or "", or `model_only` (a
 * build timing the model's candidates), the model's only: measured records
 * of other devices never apply.  1 with *rec set; 0 when there is none;
 * negative (AP_E*) when L1 cannot be read (cache.h). */
int ap_tune_records_get(ap_tiers *t, const uint8_t sig[32], const char *target,
			const char *device, bool model_only, ap_tune_record *rec);

/* The record of (sig, target) in L1 alone, as ap_cache_tuning_get reads
 * it (`device` NULL: the newest measured record before the model's; "":
 * the model's; else that device's measured record): what this node has
 * stored or copied, for the checks that must not reach another node's
 * records (a report's candidates, whether a choice changed, a bundle's
 * staleness).  1 with *rec set, 0 when there is none (also without a
 * cache), negative on an L1 error.  Not counted in the tiers' counts. */
int ap_tune_records_local(ap_tiers *t, const uint8_t sig[32], const char *target,
			  const char *device, ap_tune_record *rec);

/* Stores `r` for (sig, target) in L1 (ap_cache_tuning_put: a measured
 * record by its device) and L2.  0, or L1's negative code (L2 fails open). */
int ap_tune_records_put(ap_tiers *t, const uint8_t sig[32], const char *target,
			const ap_tune_record *r);

/* Stores n records of `target` in L1 in one transaction
 * (ap_cache_tuning_put_many, `advance` as there), and only when that
 * succeeded each in L2.  0, or L1's negative code (nothing stored). */
int ap_tune_records_put_many(ap_tiers *t, const uint8_t (*sigs)[32], const char *target,
			     const ap_tune_record *recs, int n, bool advance);

/* Writes `r` of (sig, target) to L2 only, where other daemons' builds find
 * it when their L1 has none.  Nothing without L2; failures cost nothing but
 * the sharing (redis.h). */
void ap_tune_records_publish(ap_tiers *t, const uint8_t sig[32], const char *target,
			     const ap_tune_record *r);

#endif

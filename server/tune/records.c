/* records.c -- tuning records across the cache tiers (records.h): the L2
 * key and value, and the codec the tiers read and write them with.
 */
#include "records.h"

#include "../../common/graph.h"
#include "../config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* One read or write: the record's L1 row (sig, target, device) and value. */
struct rec_io {
	const uint8_t *sig;
	const char *target;
	const char *device;        /* L1's lookup: "" the model's, else a device's */
	bool measured;             /* L2: a measured record of `device` */
	ap_tune_record *rec;       /* get: filled; put: the record */
};

/* The L2 key of (sig, target) and a measured record's device (NULL or "":
 * the model's record). */
static void record_key(const uint8_t sig[32], const char *target, const char *device,
		       uint8_t key[32])
{
	ap_sha256_ctx *h = ap_sha256_new();
	static const char tag[] = "apollo tuning record v2";

	if (!h) {
		memset(key, 0, 32);   /* never read: the put and get below fail first */
		return;
	}
	ap_sha256_update(h, tag, sizeof(tag));
	ap_sha256_update(h, sig, 32);
	ap_sha256_update(h, target, strlen(target) + 1);
	ap_sha256_update(h, device && *device ? "m" : "c", 1);
	if (device && *device)
		ap_sha256_update(h, device, strlen(device) + 1);
	ap_sha256_final(h, key);
}

/* Whether s is min..max bytes of printable ASCII. */
static bool printable(const char *s, size_t min, size_t max)
{
	size_t n = 0;

	for (; s && s[n]; n++)
		if ((unsigned char)s[n] < 0x20 || (unsigned char)s[n] > 0x7e || n >= max)
			return false;
	return s && n >= min;
}

/* Copies part i of e into dst (cap bytes) when it is printable text that
 * fits (no NUL inside: printable() would stop there). */
static bool l2_text(const ap_redis_entry *e, int i, char *dst, size_t cap)
{
	if (e->part_len[i] >= cap || memchr(e->part[i], 0, e->part_len[i]))
		return false;
	memcpy(dst, e->part[i], e->part_len[i]);
	dst[e->part_len[i]] = '\0';
	return printable(dst, 0, cap - 1);
}

static int rec_l1_get(void *user, ap_cache *c)
{
	struct rec_io *io = user;

	return ap_cache_tuning_get(c, io->sig, io->target, io->device, io->rec);
}

/* The six parts, checked (records.h). */
static bool rec_decode(void *user, const ap_redis_entry *e)
{
	struct rec_io *io = user;
	ap_tune_record *out = io->rec;
	char nums[128];
	bool ok;

	memset(out, 0, sizeof(*out));
	ok = e->n == 6 && l2_text(e, 0, out->emitter, sizeof(out->emitter)) &&
	     l2_text(e, 1, out->config, sizeof(out->config)) &&
	     l2_text(e, 2, out->method, sizeof(out->method)) &&
	     l2_text(e, 3, out->device, sizeof(out->device)) &&
	     l2_text(e, 4, out->candidates, sizeof(out->candidates)) &&
	     l2_text(e, 5, nums, sizeof(nums)) &&
	     sscanf(nums, "%u %lf %lf %u", &out->sms, &out->modelled_us, &out->measured_us,
		    &out->tried) == 4 &&
	     isfinite(out->modelled_us) && isfinite(out->measured_us) &&
	     (out->measured_us >= 0) == io->measured &&
	     (!io->measured || !strcmp(out->device, io->device));
	if (!ok)
		ap_log(AP_LOG_WARN, "shared cache: a malformed tuning record, ignored");
	return ok;
}

static int rec_l1_put(void *user, ap_cache *c)
{
	struct rec_io *io = user;

	return ap_cache_tuning_put(c, io->sig, io->target, io->rec);
}

static const ap_tier_codec rec_codec = { rec_l1_get, rec_decode, rec_l1_put };

/* One stage of a lookup: `device`'s measured record ("" : the model's). */
static int get_one(ap_tiers *t, const uint8_t sig[32], const char *target, const char *device,
		   ap_tune_record *rec)
{
	ap_tune_record got;
	struct rec_io io = { sig, target, device, *device != '\0', &got };
	uint8_t key[32];
	int tier;

	record_key(sig, target, device, key);
	tier = ap_tiers_get(t, AP_TIER_TUNING, key, 0, &rec_codec, &io);
	if (tier > 0)
		*rec = got;
	return tier < 0 ? tier : tier > 0;
}

int ap_tune_records_get(ap_tiers *t, const uint8_t sig[32], const char *target,
			const char *device, bool model_only, ap_tune_record *rec)
{
	int rc = 0;

	if (!model_only && device && *device && (rc = get_one(t, sig, target, device, rec)))
		return rc;
	return get_one(t, sig, target, "", rec);
}

int ap_tune_records_local(ap_tiers *t, const uint8_t sig[32], const char *target,
			  const char *device, ap_tune_record *rec)
{
	return ap_cache_tuning_get(ap_tiers_cache(t), sig, target, device, rec);
}

/* The six parts of r (nums: its numbers' text, 128 bytes). */
static void record_parts(const ap_tune_record *r, char *nums, const uint8_t *parts[6],
			 size_t lens[6])
{
	snprintf(nums, 128, "%u %.17g %.17g %u", r->sms, r->modelled_us, r->measured_us, r->tried);
	parts[0] = (const uint8_t *)r->emitter;
	parts[1] = (const uint8_t *)r->config;
	parts[2] = (const uint8_t *)r->method;
	parts[3] = (const uint8_t *)r->device;
	parts[4] = (const uint8_t *)r->candidates;
	parts[5] = (const uint8_t *)nums;
	for (int i = 0; i < 6; i++)
		lens[i] = strnlen((const char *)parts[i], 1024);
}

static int put(ap_tiers *t, const uint8_t sig[32], const char *target, const ap_tune_record *r,
	       unsigned flags)
{
	struct rec_io io = { sig, target, NULL, false, (ap_tune_record *)r };
	const uint8_t *parts[6];
	size_t lens[6];
	char nums[128];
	uint8_t key[32];

	if ((flags & AP_TIERS_L2_ONLY) && !ap_tiers_redis(t))
		return 0;
	record_parts(r, nums, parts, lens);
	record_key(sig, target, r->measured_us >= 0 ? r->device : NULL, key);
	return ap_tiers_put(t, AP_TIER_TUNING, key, flags, &rec_codec, &io, 6, parts, lens);
}

int ap_tune_records_put(ap_tiers *t, const uint8_t sig[32], const char *target,
			const ap_tune_record *r)
{
	return put(t, sig, target, r, 0);
}

void ap_tune_records_publish(ap_tiers *t, const uint8_t sig[32], const char *target,
			     const ap_tune_record *r)
{
	put(t, sig, target, r, AP_TIERS_L2_ONLY);
}

int ap_tune_records_put_many(ap_tiers *t, const uint8_t (*sigs)[32], const char *target,
			     const ap_tune_record *recs, int n, bool advance)
{
	int rc = ap_cache_tuning_put_many(ap_tiers_cache(t), sigs, target, recs, n, advance);

	if (rc < 0)
		return rc;
	for (int i = 0; i < n; i++)
		ap_tune_records_publish(t, sigs[i], target, &recs[i]);
	return 0;
}

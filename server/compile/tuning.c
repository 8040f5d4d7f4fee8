/* tuning.c -- the build's tuning hooks (server/tune/tune.h) over the
 * records of server/tune/records.h, the devices clients name, and tuning
 * reports (compile.h).
 */
#include "compile_internal.h"

/* ---- tuning records (server/tune/records.h) -------------------------------- */

/* Whether s is min..max bytes of printable ASCII. */
static bool printable(const char *s, size_t min, size_t max)
{
	size_t n = 0;

	for (; s && s[n]; n++)
		if ((unsigned char)s[n] < 0x20 || (unsigned char)s[n] > 0x7e || n >= max)
			return false;
	return s && n >= min;
}

/* ap_tune_hooks.lookup of a request (struct tune_user): its device's
 * measured record, else the model's, through the tiers; a request naming
 * no device, and a tune_variant build (which times the model's
 * candidates), use the model's only (ap_tune_records_get). */
int ap__compile_tune_lookup(void *user, const uint8_t sig[32], ap_tune_record *rec)
{
	struct tune_user *u = user;

	return ap_tune_records_get(u->c->tiers, sig, u->target, u->device, u->variant, rec);
}

/* ap_tune_hooks.store: the model's record of a search, to L1 and L2. */
void ap__compile_tune_store(void *user, const uint8_t sig[32], const ap_tune_record *rec)
{
	struct tune_user *u = user;

	ap_tune_records_put(u->c->tiers, sig, u->target, rec);
}

/* Measurement indices ordered by signature, then time. */
static int cmp_measurement(const void *a, const void *b, void *arg)
{
	Apollo__TuneMeasurement *const *ms = arg;
	const Apollo__TuneMeasurement *x = ms[*(const int *)a], *y = ms[*(const int *)b];
	int c = memcmp(x->signature.data, y->signature.data, 32);

	if (c)
		return c;
	return (x->time_us > y->time_us) - (x->time_us < y->time_us);
}

/* ---- devices and reporters ----------------------------------------------- */

int ap_compile_device_id(const char *name, unsigned sms, char *id, size_t cap, ap_error *err)
{
	if (!printable(name, 1, 127))
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "the device name must be 1 to 127 printable ASCII characters");
	if (sms < 1 || sms > 1024)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "sm_count %u is not in 1..1024", sms);
	if ((size_t)snprintf(id, cap, "%s|%u", name, sms) >= cap)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "the device name is too long");
	return 0;
}

/* Remembers that `client` named `device` (newest kept: the oldest of
 * DEVICES_SEEN entries gives way). */
void ap__compile_device_note(ap_compiler *c, const char *device, const char *client)
{
	struct device_seen *d = NULL;
	double now = ap_now_ms();

	pthread_mutex_lock(&c->devices_mu);
	for (int i = 0; i < DEVICES_SEEN && !d; i++)
		if (c->devices[i].last_ms > 0 && !strcmp(c->devices[i].device, device) &&
		    !strcmp(c->devices[i].client, client))
			d = &c->devices[i];
	for (int i = 0; i < DEVICES_SEEN && !d; i++)
		if (c->devices[i].last_ms == 0)
			d = &c->devices[i];
	if (!d) {
		d = &c->devices[0];
		for (int i = 1; i < DEVICES_SEEN; i++)
			if (c->devices[i].last_ms < d->last_ms)
				d = &c->devices[i];
	}
	snprintf(d->device, sizeof(d->device), "%s", device);
	snprintf(d->client, sizeof(d->client), "%s", client);
	d->last_ms = now;
	pthread_mutex_unlock(&c->devices_mu);
}

static bool device_named(ap_compiler *c, const char *device, const char *client)
{
	bool found = false;

	pthread_mutex_lock(&c->devices_mu);
	for (int i = 0; i < DEVICES_SEEN && !found; i++)
		found = c->devices[i].last_ms > 0 && !strcmp(c->devices[i].device, device) &&
			!strcmp(c->devices[i].client, client);
	pthread_mutex_unlock(&c->devices_mu);
	return found;
}

/* Whether `client` may report under the tune_reporters list: "any", or
 * comma-separated uids and the word "tcp" (every TCP client). */
static bool reporter_allowed(const char *list, const char *client)
{
	char copy[256], *save = NULL;

	if (!strcmp(client, TRUSTED_REPORTER) || !strcmp(list, "any"))
		return true;
	snprintf(copy, sizeof(copy), "%s", list);
	for (char *t = strtok_r(copy, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
		if (!strcmp(t, "tcp") && !strncmp(client, "tcp:", 4))
			return true;
		if (!strncmp(client, "uid:", 4) && !strcmp(t, client + 4))
			return true;
	}
	return false;
}

/* Who may report, and about what: a daemon with a cache, a client the
 * tune_reporters option allows, a GPU target this daemon compiles for, a
 * device this client named in a compile request (or the daemon's own
 * tuner), 1 to AP_TUNE_REPORT_MAX measurements.  0 with the device's id in
 * device (cap bytes), or AP_EUNSUPPORTED, AP_EINVAL, AP_ETOOLARGE with
 * `err` set. */
static int report_admit(ap_compiler *c, const char *client, const Apollo__TuneReport *rep,
			char *device, size_t cap, ap_error *err)
{
	ap_error why;
	bool gpu;
	int out_kind, rc;

	if (!ap_cache_enabled(c->cache))
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "tuning report: this daemon runs without a cache, so it keeps no "
				    "tuning records");
	if (!reporter_allowed(c->tune_reporters, client))
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "tuning report: client %s may not report (tune_reporters = %s)",
				    client, c->tune_reporters);
	if (!rep->target || !*rep->target || strlen(rep->target) > 31 ||
	    ap_compile_parse_target(rep->target, 0, &gpu, &out_kind, err) < 0)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "tuning report: target '%.32s' is not a target this daemon compiles for",
				    rep->target ? rep->target : "");
	if (!gpu)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "tuning report: target %s is refused: host kernels are tuned by the "
				    "cost model alone", rep->target);
	if ((rc = ap_compile_device_id(rep->device, rep->sm_count, device, cap, &why)))
		return ap_error_set(err, rc, NULL, NULL, "tuning report: %s", why.msg);
	if (strcmp(client, TRUSTED_REPORTER) && !device_named(c, device, client))
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "tuning report: device '%.127s' (%u SMs) was not named by this client "
				    "(%s) in a compile request: report from the GPU the bundles ran on "
				    "(CompileRequest.device)", rep->device, rep->sm_count, client);
	if (rep->n_measurements < 1 || rep->n_measurements > AP_TUNE_REPORT_MAX)
		return ap_error_set(err, rep->n_measurements ? AP_ETOOLARGE : AP_EINVAL, NULL, NULL,
				    "tuning report: %zu measurements (1 to %d accepted)",
				    rep->n_measurements, AP_TUNE_REPORT_MAX);
	return 0;
}

/* Checks one report's header and measurements (every one before any is
 * stored); fills model[i] with the model's record of measurement i. */
static int report_check(ap_compiler *c, const Apollo__TuneReport *rep, ap_tune_record *model,
			ap_error *err)
{
	size_t n = rep->n_measurements;
	char hex[17];

	for (size_t i = 0; i < n; i++) {
		const Apollo__TuneMeasurement *m = rep->measurements[i];
		const char *why = NULL;
		int found;

		if (m->signature.len != 32)
			why = "its signature is not 32 bytes";
		else if (!printable(m->schedule, 1, sizeof(model->config) - 1))
			why = "its schedule is not 1 to 255 printable ASCII characters";
		else if (!isfinite(m->time_us) || m->time_us <= 0 || m->time_us >= 1e7)
			why = "its time is not in (0, 1e7) microseconds";
		else if (m->runs < 1)
			why = "it names no timed run";
		if (why)
			return ap_error_set(err, AP_EINVAL, NULL, NULL, "tuning report: measurement %zu: %s",
					    i, why);
		ap_hex(m->signature.data, 8, hex);
		found = ap_tune_records_local(c->tiers, m->signature.data, rep->target, "", &model[i]);
		if (found < 0)
			return ap_error_set(err, AP_EIO, NULL, NULL,
					    "tuning report: the tuning records cannot be read");
		if (found == 0)
			return ap_error_set(err, AP_EINVAL, NULL, NULL,
					    "tuning report: measurement %zu: kernel %s has no tuning record "
					    "for %s (compile with tune_variant first)", i, hex, rep->target);
		if (!ap_tune_is_candidate(&model[i], m->schedule))
			return ap_error_set(err, AP_EINVAL, NULL, NULL,
					    "tuning report: measurement %zu: '%.200s' is not a candidate of "
					    "kernel %s on %s", i, m->schedule, hex, rep->target);
	}
	return 0;
}

int ap_compiler_tune_report(ap_compiler *c, const char *client, const Apollo__TuneReport *rep,
			    unsigned *records, unsigned *pending, uint64_t *generation, ap_error *err)
{
	size_t n = rep->n_measurements;
	ap_tune_record *recs = NULL, *model = NULL;
	ap_cache_report *rows = NULL;
	uint8_t (*sigs)[32] = NULL;
	int *order = NULL, n_recs = 0, rc = 0;
	char device[160];

	*records = 0;
	*pending = 0;
	*generation = 0;
	if ((rc = report_admit(c, client, rep, device, sizeof(device), err)))
		return rc;
	model = calloc(n, sizeof(*model));
	order = calloc(n, sizeof(*order));
	rows = calloc(n, sizeof(*rows));
	recs = calloc(n, sizeof(*recs));
	sigs = calloc(n, sizeof(*sigs));
	if (!model || !order || !rows || !recs || !sigs) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		goto out;
	}
	if ((rc = report_check(c, rep, model, err)))
		goto out;
	for (size_t i = 0; i < n; i++) {
		order[i] = (int)i;
		rows[i] = (ap_cache_report){ rep->measurements[i]->signature.data,
					     rep->measurements[i]->schedule,
					     rep->measurements[i]->time_us };
	}
	if (ap_cache_report_put(c->cache, rep->target, device, client, rows, (int)n) < 0) {
		rc = ap_error_set(err, AP_EIO, NULL, NULL, "tuning report: it could not be stored");
		goto out;
	}
	/* per kernel: the schedule the clients agree on becomes the device's
	 * measured record when it differs from the one it has */
	qsort_r(order, n, sizeof(*order), cmp_measurement, rep->measurements);
	for (size_t i = 0; i < n;) {
		const Apollo__TuneMeasurement *m = rep->measurements[order[i]];
		const ap_tune_record *mr = &model[order[i]];
		ap_tune_record *r = &recs[n_recs], had;
		char agreed[256];
		double median = 0;
		unsigned clients = 0;
		size_t j = i;
		int a;

		while (j < n && !memcmp(rep->measurements[order[j]]->signature.data,
					m->signature.data, 32))
			j++;
		i = j;
		a = ap_cache_report_agreed(c->cache, m->signature.data, rep->target, device,
					   TRUSTED_REPORTER, agreed, sizeof(agreed), &median, &clients);
		if (a < 0) {
			rc = ap_error_set(err, AP_EIO, NULL, NULL,
					  "tuning report: the reports cannot be read");
			goto out;
		}
		if (a == 0) {
			(*pending)++;
			continue;
		}
		if (ap_tune_records_local(c->tiers, m->signature.data, rep->target, device, &had) == 1 &&
		    !strcmp(had.config, agreed))
			continue;   /* the same choice: nothing retires */
		*r = *mr;
		snprintf(r->config, sizeof(r->config), "%s", agreed);
		snprintf(r->method, sizeof(r->method), "measured");
		snprintf(r->device, sizeof(r->device), "%s", device);
		r->sms = rep->sm_count;
		r->measured_us = median;
		/* the model's time is known for its own choice only */
		r->modelled_us = strcmp(mr->config, agreed) ? 0 : mr->modelled_us;
		r->tried = clients;
		memcpy(sigs[n_recs++], m->signature.data, 32);
	}
	if (n_recs && ap_tune_records_put_many(c->tiers, (const uint8_t (*)[32])sigs, rep->target,
					       recs, n_recs, false) < 0) {
		rc = ap_error_set(err, AP_EIO, NULL, NULL,
				  "tuning report: the measured records could not be stored");
		goto out;
	}
	*records = (unsigned)n_recs;
	*generation = ap_cache_tuning_generation(c->cache);
	atomic_fetch_add(&c->tune_reports, 1);
	atomic_fetch_add(&c->tune_measurements, n);
	atomic_fetch_add(&c->tune_records, (uint64_t)n_recs);
	atomic_fetch_add(&c->tune_pending, *pending);
out:
	free(model);
	free(order);
	free(rows);
	free(recs);
	free(sigs);
	return rc;
}

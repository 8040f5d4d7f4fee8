/* metrics.c -- the metrics snapshot and its Prometheus text (see
 * metrics.h).
 *
 * Approach: one allocation holds a snapshot: fixed arrays of families,
 * samples and labels, filled in order (a family's samples, and a sample's
 * labels, are consecutive), and a small pool for the few label values
 * that are formatted (histogram bounds).  Names, help texts and most label
 * values are string literals.  The protobuf-c messages point into the
 * arrays, so the snapshot packs straight into a StatsReply and is freed
 * at once.
 */
#include "metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/apollo.pb-c.h"

#define MAX_FAM 64
#define MAX_SAMPLES 320
#define MAX_LABELS 512
#define POOL 1024

struct ap_metrics_snapshot {
	Apollo__MetricFamily fam[MAX_FAM], *fam_ptr[MAX_FAM];
	Apollo__MetricSample smp[MAX_SAMPLES], *smp_ptr[MAX_SAMPLES];
	Apollo__MetricLabel lab[MAX_LABELS], *lab_ptr[MAX_LABELS];
	char pool[POOL];
	size_t n_fam, n_smp, n_lab, used;
};

static const char *const kind_names[AP_KINDS] = { "compile", "ping", "hello", "stats", "tune",
						   "other" };
static const char *const tier_names[4] = { "compiled", "l1", "l2", "shared" };
/* Error labels by -code (AP_E*). */
static const char *const code_names[13] = {
	"", "bad_frame", "bad_message", "invalid_graph", "unsupported", "shape", "too_large",
	"compile", "internal", "busy", "version", "out_of_memory", "io",
};

static void family(ap_metrics_snapshot *m, const char *name, const char *type, const char *help)
{
	Apollo__MetricFamily *f;

	if (m->n_fam >= MAX_FAM)
		return;
	f = &m->fam[m->n_fam];
	apollo__metric_family__init(f);
	f->name = (char *)name;
	f->type = (char *)type;
	f->help = (char *)help;
	f->samples = &m->smp_ptr[m->n_smp];
	m->fam_ptr[m->n_fam++] = f;
}

/* A sample of the current family: `n` label pairs (name, value) follow. */
static void sample(ap_metrics_snapshot *m, const char *suffix, double value, int n, ...)
{
	Apollo__MetricFamily *f = m->n_fam ? &m->fam[m->n_fam - 1] : NULL;
	Apollo__MetricSample *s;
	va_list ap;

	if (!f || m->n_smp >= MAX_SAMPLES || m->n_lab + (size_t)n > MAX_LABELS)
		return;
	s = &m->smp[m->n_smp];
	apollo__metric_sample__init(s);
	s->value = value;
	s->suffix = (char *)(suffix ? suffix : "");
	s->labels = &m->lab_ptr[m->n_lab];
	va_start(ap, n);
	for (int i = 0; i < n; i++) {
		Apollo__MetricLabel *l = &m->lab[m->n_lab];

		apollo__metric_label__init(l);
		l->name = va_arg(ap, char *);
		l->value = va_arg(ap, char *);
		m->lab_ptr[m->n_lab++] = l;
		s->n_labels++;
	}
	va_end(ap);
	m->smp_ptr[m->n_smp++] = s;
	f->n_samples++;
}

/* A formatted string kept in the snapshot ("" when the pool is full). */
static char *keep(ap_metrics_snapshot *m, const char *fmt, double v)
{
	int n = snprintf(m->pool + m->used, POOL - m->used, fmt, v);
	char *s = m->pool + m->used;

	if (n < 0 || (size_t)n >= POOL - m->used)
		return (char *)"";
	m->used += (size_t)n + 1;
	return s;
}

/* A gauge or counter family of one sample without labels. */
static void single(ap_metrics_snapshot *m, const char *name, const char *type, const char *help,
		   double v)
{
	family(m, name, type, help);
	sample(m, NULL, v, 0);
}

/* A family of cluster lease counts `n` by event, and its gauge of waits. */
static void leases(ap_metrics_snapshot *m, const char *name, const char *gauge, const char *help,
		   const char *gauge_help, const ap_lease_counts *n)
{
	family(m, name, "counter", help);
	sample(m, NULL, (double)n->taken, 1, "event", "taken");
	sample(m, NULL, (double)n->waited, 1, "event", "waited");
	sample(m, NULL, (double)n->lapsed, 1, "event", "lapsed");
	sample(m, NULL, (double)n->taken_over, 1, "event", "taken_over");
	sample(m, NULL, (double)n->timeouts, 1, "event", "timeout");
	sample(m, NULL, (double)n->lost, 1, "event", "lost");
	single(m, gauge, "gauge", gauge_help, (double)n->waiting);
}

/* The latency histogram per stage of compiled requests (issue 26, item
 * 4): one family, a `stage` label, buckets ap_stage_bucket_s. */
static void build_stages(ap_metrics_snapshot *m, const ap_metrics_input *in)
{
	const ap_compile_counters *cc = in->compile;
	const char *le[AP_STAGE_BUCKETS];

	for (int b = 0; b < AP_STAGE_BUCKETS; b++)
		le[b] = keep(m, "%g", ap_stage_bucket_s[b]);
	family(m, "apollo_stage_duration_seconds", "histogram",
	       "Time of each stage of the compile requests answered by compiling: import, "
	       "partition, layer1 and tuning (parts of codegen), codegen, backend, cache (writes).");
	for (int s = 0; s < AP_STAGES; s++) {
		uint64_t cum = 0, total = 0;

		for (int b = 0; b <= AP_STAGE_BUCKETS; b++)
			total += cc->stage_hist[s][b];
		for (int b = 0; b < AP_STAGE_BUCKETS; b++) {
			cum += cc->stage_hist[s][b];
			sample(m, "_bucket", (double)cum, 2, "stage", ap_stage_names[s], "le", le[b]);
		}
		sample(m, "_bucket", (double)total, 2, "stage", ap_stage_names[s], "le", "+Inf");
		sample(m, "_sum", cc->stage_sum_s[s], 1, "stage", ap_stage_names[s]);
		sample(m, "_count", (double)total, 1, "stage", ap_stage_names[s]);
	}
}

/* The hit ratio per cache tier (issue 26, item 4): of the compile requests
 * answered with a bundle, the share each tier answered (l1, l2, shared;
 * "any": all three), and the same of the kernels compiled requests needed;
 * 0 before the first. */
static void build_hit_ratio(ap_metrics_snapshot *m, const ap_metrics_input *in)
{
	const ap_compile_counters *cc = in->compile;
	const uint64_t *of[2] = { cc->tier, cc->kernel_tier };
	static const char *const what[2] = { "requests", "kernels" };

	family(m, "apollo_cache_hit_ratio", "gauge",
	       "Share of the compile requests answered with a bundle (of=requests), and of the "
	       "kernels of compiled requests (of=kernels), that each cache tier served: l1, l2, "
	       "shared (an identical compile in flight), any (all three); 0 before the first.");
	for (int w = 0; w < 2; w++) {
		uint64_t all = of[w][0] + of[w][1] + of[w][2] + of[w][3];

		for (int t = 1; t < 4; t++)
			sample(m, NULL, all ? (double)of[w][t] / (double)all : 0, 2, "of", what[w],
			       "tier", tier_names[t]);
		sample(m, NULL, all ? (double)(all - of[w][0]) / (double)all : 0, 2, "of", what[w],
		       "tier", "any");
	}
}

static void build_requests(ap_metrics_snapshot *m, const ap_metrics_input *in)
{
	const ap_compile_counters *cc = in->compile;

	single(m, "apollo_uptime_seconds", "gauge", "Seconds since apollod started.", in->uptime_s);
	family(m, "apollo_requests_total", "counter",
	       "Frames answered, by kind of request and result (error: an Error reply or a "
	       "CompileResponse error).");
	for (int k = 0; k < AP_KINDS; k++)
		for (int r = 0; r < 2; r++)
			sample(m, NULL, (double)in->requests[k][r], 2, "kind", kind_names[k], "result",
			       r ? "error" : "ok");
	family(m, "apollo_errors_total", "counter", "Errors answered, by code.");
	for (int c = 1; c < 13; c++)
		sample(m, NULL, (double)(in->net_errors_by_code[c] + cc->errors_by_code[c]), 1, "code",
		       code_names[c]);
	family(m, "apollo_compile_answers_total", "counter",
	       "Compile requests answered with a bundle, by where it came from: compiled here, "
	       "the local cache (l1), the shared cache (l2), an identical request in flight "
	       "(shared).");
	for (int t = 0; t < 4; t++)
		sample(m, NULL, (double)cc->tier[t], 1, "tier", tier_names[t]);
	family(m, "apollo_kernels_total", "counter",
	       "Kernels of the compiled answers, by where each came from: compiled by the "
	       "backend, l1, l2, or another request's compile in flight (shared).");
	for (int t = 0; t < 4; t++)
		sample(m, NULL, (double)cc->kernel_tier[t], 1, "tier", tier_names[t]);
	family(m, "apollo_compile_duration_seconds", "histogram",
	       "Wall time of the compile requests answered by compiling.");
	{
		uint64_t cum = 0, total = 0;

		for (int b = 0; b <= AP_COMPILE_BUCKETS; b++)
			total += cc->compile_hist[b];
		for (int b = 0; b < AP_COMPILE_BUCKETS; b++) {
			cum += cc->compile_hist[b];
			sample(m, "_bucket", (double)cum, 1, "le", keep(m, "%g", ap_compile_bucket_s[b]));
		}
		sample(m, "_bucket", (double)total, 1, "le", "+Inf");
		sample(m, "_sum", cc->compile_sum_s, 0);
		sample(m, "_count", (double)total, 0);
	}
	build_stages(m, in);
	build_hit_ratio(m, in);
	single(m, "apollo_queue_depth", "gauge",
	       "Compile requests waiting for a worker thread.", in->queued);
	single(m, "apollo_in_flight", "gauge",
	       "Compile requests queued or running (at most max_pending).", in->in_flight);
	single(m, "apollo_decoding", "gauge",
	       "Large frames being decoded on worker threads.", in->decoding);
	single(m, "apollo_flight_waiting", "gauge",
	       "Requests and kernels waiting for an identical one being compiled.",
	       (double)cc->flight_waiting);
	single(m, "apollo_flight_timeouts_total", "counter",
	       "Waits for an identical compile that reached flight_wait_ms (then compiled "
	       "alone).", (double)cc->flight_timeouts);
	leases(m, "apollo_cluster_leases_total", "apollo_cluster_lease_waiting",
	       "Cluster leases of cold requests (redis_lease_ms): taken by this daemon "
	       "(take-overs included), waits for another daemon's, lapses seen while "
	       "waiting (the holder's lease gone without its entry), leases taken over "
	       "after a lapse, waits that reached flight_wait_ms (then compiled here), "
	       "leases lost while held (not renewed in time).",
	       "Requests waiting now for another daemon's compile (its cluster lease).",
	       &cc->lease);
	leases(m, "apollo_cluster_kernel_leases_total", "apollo_cluster_kernel_lease_waiting",
	       "Cluster leases of cold kernels (redis_lease_ms), the same events as "
	       "apollo_cluster_leases_total's: taken, waits for another daemon's, lapses "
	       "seen while waiting, take-overs, waits that reached flight_wait_ms, leases "
	       "lost while held.",
	       "Kernels waiting now for another daemon's compile (its cluster lease).",
	       &cc->kernel_lease);
	single(m, "apollo_request_memo_hits_total", "counter",
	       "Compile requests answered by the key remembered for their bytes, without "
	       "decoding their graph.", (double)cc->memo_hits);
	single(m, "apollo_clients", "gauge", "Open client connections.", in->clients);
	single(m, "apollo_clients_evicted_total", "counter",
	       "Idle connections closed to make room for another user's when the daemon "
	       "was full.", (double)in->evicted);
	single(m, "apollo_pending_memory_bytes", "gauge",
	       "Memory held against max_pending_memory: the requests queued or running "
	       "(decoded size and compile estimate) and the large frames waiting to be "
	       "decoded.", (double)in->pending_memory);
}

static void build_tuning(ap_metrics_snapshot *m, const ap_metrics_input *in)
{
	const ap_compile_counters *cc = in->compile;

	family(m, "apollo_tuning_kernels_total", "counter",
	       "Tunable kernels of compiled requests, by where their configuration came from: a "
	       "cost-model record, a measured record, a search in that request.");
	sample(m, NULL, (double)(cc->tune_hits - cc->tune_measured), 1, "source", "record");
	sample(m, NULL, (double)cc->tune_measured, 1, "source", "measured");
	sample(m, NULL, (double)cc->tune_searched, 1, "source", "searched");
	single(m, "apollo_tuning_configurations_total", "counter",
	       "Configurations the searches evaluated under the cost model.",
	       (double)cc->tune_tried);
	single(m, "apollo_tuning_seconds_total", "counter", "Time spent searching.", cc->tune_s);
	single(m, "apollo_tuning_capped_total", "counter",
	       "Kernel searches the safety time limit (tune_budget_ms) cut short or left "
	       "undone: their bundles depend on the load and are not cached.",
	       (double)cc->tune_capped);
	single(m, "apollo_tuning_reports_total", "counter",
	       "Tuning reports (apollo-client tune) accepted.", (double)cc->tune_reports);
	single(m, "apollo_tuning_measurements_total", "counter",
	       "Measurements those reports carried.", (double)cc->tune_measurements);
	single(m, "apollo_tuning_measured_records_total", "counter",
	       "Measured tuning records stored from them.", (double)cc->tune_records);
	single(m, "apollo_tuning_pending_total", "counter",
	       "Reported kernels that waited for a second client's agreement.",
	       (double)cc->tune_pending);
	family(m, "apollo_tuning_background_total", "counter",
	       "The background tuner (tune_refine, tune_measure): requests tuned, requests "
	       "dropped (queue full), jobs failed, candidates compiled with ptxas -v, "
	       "records refined and of those whose choice moved, candidates timed on this "
	       "host's GPU, measured records stored.");
	sample(m, NULL, (double)cc->autotune.jobs, 1, "event", "job");
	sample(m, NULL, (double)cc->autotune.dropped, 1, "event", "dropped");
	sample(m, NULL, (double)cc->autotune.failed, 1, "event", "failed");
	sample(m, NULL, (double)cc->autotune.compiled, 1, "event", "compiled");
	sample(m, NULL, (double)cc->autotune.refined, 1, "event", "refined");
	sample(m, NULL, (double)cc->autotune.moved, 1, "event", "moved");
	sample(m, NULL, (double)cc->autotune.timed, 1, "event", "timed");
	sample(m, NULL, (double)cc->autotune.measured, 1, "event", "measured");
}

static void build_cache(ap_metrics_snapshot *m, const ap_metrics_input *in)
{
	const ap_cache_counts *kc = in->cache;

	family(m, "apollo_cache_entries", "gauge", "Entries of the local cache (l1), by kind.");
	sample(m, NULL, (double)kc->actions, 1, "kind", "action");
	sample(m, NULL, (double)kc->kernels, 1, "kind", "kernel");
	sample(m, NULL, (double)kc->tuning, 1, "kind", "tuning");
	family(m, "apollo_cache_bytes", "gauge",
	       "Bytes of blobs held: in the local cache file (l1) and in its memory tier "
	       "(memory).");
	sample(m, NULL, (double)kc->blob_bytes, 1, "tier", "l1");
	sample(m, NULL, (double)kc->memory_bytes, 1, "tier", "memory");
	single(m, "apollo_cache_max_bytes", "gauge",
	       "cache_max_bytes: the local cache's limit (0: none).", (double)kc->max_bytes);
	single(m, "apollo_cache_evicted_blobs_total", "counter",
	       "Blobs the local cache evicted to stay under its limit.", (double)kc->evicted_blobs);
	single(m, "apollo_cache_evicted_bytes_total", "counter",
	       "Bytes of the blobs evicted.", (double)kc->evicted_bytes);
	single(m, "apollo_cache_memory_hits_total", "counter",
	       "Blob reads answered by the memory tier.", (double)kc->memory_hits);
	single(m, "apollo_cache_degraded", "gauge",
	       "1 while the local cache is degraded: the file system had no room for a write "
	       "(disk full, file-size limit, quota); reads go on, writes are skipped and retried.",
	       kc->degraded ? 1 : 0);
	single(m, "apollo_cache_skipped_writes_total", "counter",
	       "Writes the local cache skipped while degraded.", (double)kc->skipped_writes);
	single(m, "apollo_cache_space_failures_total", "counter",
	       "Writes of the local cache the file system refused for space.",
	       (double)kc->space_failures);
}

static void build_redis(ap_metrics_snapshot *m, const ap_metrics_input *in)
{
	const ap_redis_counts *r = in->redis;

	single(m, "apollo_redis_enabled", "gauge", "1 when the shared cache (redis) is configured.",
	       r ? 1 : 0);
	if (!r)
		return;
	single(m, "apollo_redis_circuit_state", "gauge",
	       "The shared cache's circuit breaker: 0 closed, 1 open (nothing sent), 2 half-open.",
	       (double)r->state);
	single(m, "apollo_redis_circuit_opens_total", "counter", "Times the breaker opened.",
	       (double)r->opens);
	family(m, "apollo_redis_operations_total", "counter",
	       "Shared cache lookups (get: hit or miss) and writes (put: ok or error).");
	sample(m, NULL, (double)r->hits, 2, "op", "get", "result", "hit");
	sample(m, NULL, (double)r->misses, 2, "op", "get", "result", "miss");
	sample(m, NULL, (double)(r->puts - r->put_failures), 2, "op", "put", "result", "ok");
	sample(m, NULL, (double)r->put_failures, 2, "op", "put", "result", "error");
	single(m, "apollo_redis_failures_total", "counter",
	       "Calls to Redis that failed (connect, timeout, error reply, too large).",
	       (double)r->failures);
	single(m, "apollo_redis_skipped_total", "counter",
	       "Calls not made because the breaker was open.", (double)r->skipped);
	single(m, "apollo_redis_verify_failures_total", "counter",
	       "Entries read from Redis whose signature or format did not verify (not served).",
	       (double)r->verify_failures);
	single(m, "apollo_redis_refused_replies_total", "counter",
	       "Replies refused for their size (a bulk string over redis_max_value_bytes, or a "
	       "reply over it + 64 KiB or 1024 elements in all); each also a failure.",
	       (double)r->refused);
	family(m, "apollo_redis_bytes_total", "counter",
	       "Bytes of entries read from and written to the shared cache (l2).");
	sample(m, NULL, (double)r->bytes_read, 1, "direction", "read");
	sample(m, NULL, (double)r->bytes_written, 1, "direction", "written");
}

ap_metrics_snapshot *ap_metrics_build(const ap_metrics_input *in)
{
	ap_metrics_snapshot *m = calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	build_requests(m, in);
	build_tuning(m, in);
	build_cache(m, in);
	build_redis(m, in);
	return m;
}

ap_metrics_snapshot *ap_metrics_snapshot_free(ap_metrics_snapshot *m)
{
	free(m);
	return NULL;
}

Apollo__MetricFamily **ap_metrics_families(ap_metrics_snapshot *m, size_t *n)
{
	*n = m->n_fam;
	return m->fam_ptr;
}

/* A growable text buffer. */
struct text {
	char *p;
	size_t len, cap;
	bool oom;
};

static void put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(struct text *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (t->oom)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			t->oom = true;
			return;
		}
		if ((size_t)n < t->cap - t->len) {
			t->len += (size_t)n;
			return;
		}
		{
			size_t ncap = t->cap * 2 + (size_t)n;
			char *np = realloc(t->p, ncap);

			if (!np) {
				t->oom = true;
				return;
			}
			t->p = np;
			t->cap = ncap;
		}
	}
}

/* A label value with \\, \" and \n escaped (`quotes` false: a HELP
 * text, where only \\ and \n are escaped). */
static void put_escaped(struct text *t, const char *s, bool quotes)
{
	for (; s && *s; s++) {
		if (*s == '\\')
			put(t, "\\\\");
		else if (*s == '"' && quotes)
			put(t, "\\\"");
		else if (*s == '\n')
			put(t, "\\n");
		else
			put(t, "%c", *s);
	}
}

static void put_value(struct text *t, double v)
{
	if (isnan(v))
		put(t, "NaN");
	else if (isinf(v))
		put(t, v > 0 ? "+Inf" : "-Inf");
	else if (v == floor(v) && fabs(v) < 9e15)
		put(t, "%.0f", v);
	else
		put(t, "%.9g", v);
}

char *ap_metrics_text(Apollo__MetricFamily *const *f, size_t n, size_t *len)
{
	struct text t = { malloc(4096), 0, 4096, false };

	if (!t.p)
		return NULL;
	t.p[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		put(&t, "# HELP %s ", f[i]->name);
		put_escaped(&t, f[i]->help, false);
		put(&t, "\n# TYPE %s %s\n", f[i]->name, f[i]->type);
		for (size_t j = 0; j < f[i]->n_samples; j++) {
			const Apollo__MetricSample *s = f[i]->samples[j];

			put(&t, "%s%s", f[i]->name, s->suffix ? s->suffix : "");
			for (size_t k = 0; k < s->n_labels; k++) {
				put(&t, "%s%s=\"", k ? "," : "{", s->labels[k]->name);
				put_escaped(&t, s->labels[k]->value, true);
				put(&t, "\"");
			}
			put(&t, "%s ", s->n_labels ? "}" : "");
			put_value(&t, s->value);
			put(&t, "\n");
		}
	}
	if (t.oom) {
		free(t.p);
		return NULL;
	}
	*len = t.len;
	return t.p;
}

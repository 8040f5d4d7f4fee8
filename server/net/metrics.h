/* metrics.h -- apollod's metrics: one snapshot of every counter, built as
 * apollo.MetricFamily messages, and written in the Prometheus text
 * exposition format (version 0.0.4).
 *
 * The same families answer both ways: the HTTP endpoint (--metrics,
 * http.c) writes them as text, and a StatsRequest carries them in
 * StatsReply.metrics (`apollo-client stats --json`), so the two always
 * report the same numbers.  docs/cluster.md (Metrics) lists them.
 */
#ifndef AP_NET_METRICS_H
#define AP_NET_METRICS_H

#include "../../common/base.h"
#include "../cache/cache.h"
#include "../cache/redis.h"
#include "../compile/compile.h"

struct Apollo__MetricFamily;

/* Request kinds and results counted by the network front. */
enum { AP_KIND_COMPILE, AP_KIND_PING, AP_KIND_HELLO, AP_KIND_STATS, AP_KIND_TUNE, AP_KIND_OTHER,
       AP_KINDS };

/* What a snapshot is made of (all borrowed for the call). */
typedef struct ap_metrics_input {
	const ap_compile_counters *compile;
	const ap_cache_counts *cache;
	const ap_redis_counts *redis;          /* NULL: no shared cache */
	uint64_t requests[AP_KINDS][2];        /* [kind][0 ok, 1 error] */
	uint64_t net_errors_by_code[16];       /* errors the front answered, by -code */
	unsigned clients, in_flight, queued, decoding;
	uint64_t evicted;                      /* idle connections closed to make room */
	uint64_t pending_memory;               /* held against max_pending_memory, bytes */
	double uptime_s;
} ap_metrics_input;

typedef struct ap_metrics_snapshot ap_metrics_snapshot;

/* Builds every family from `in`.  NULL only when out of memory.  The
 * families (and everything they point to) live in the snapshot. */
__ap_give ap_metrics_snapshot *ap_metrics_build(const ap_metrics_input *in);
ap_metrics_snapshot *ap_metrics_snapshot_free(__ap_take ap_metrics_snapshot *m);   /* accepts NULL */
/* The families, borrowed: *n of them. */
struct Apollo__MetricFamily **ap_metrics_families(ap_metrics_snapshot *m, size_t *n);

/* Writes families in the Prometheus text format: for each, "# HELP",
 * "# TYPE", then one line per sample, label values escaped (\\, \", \n).
 * Returns a malloc'd NUL-terminated text and its length in *len, NULL
 * when out of memory. */
__ap_give char *ap_metrics_text(struct Apollo__MetricFamily *const *f, size_t n, size_t *len);

#endif

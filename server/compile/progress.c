/* progress.c -- a compile request's stage events (issue 26, item 4).
 *
 * What comes in: the stages run() and the pipeline reach, and the kernels
 * the backend finishes, from the request's worker and its helper threads.
 * What goes out: calls of the request's ap_compile_progress, bounded in
 * rate -- one per stage change, and within a stage one per
 * AP_PROGRESS_MIN_MS unless it is the stage's last unit, and a stage
 * reached again (the driver's rounds after a refusal) no more often --
 * so that a large graph (thousands of kernels, thousands of rounds) does
 * not flood the client's socket.  The
 * invariant: calls for one request are serialised by its mutex, in the
 * order the stages were reached, and none after the request returns (the
 * worker joins its helpers before it answers).
 */
#include "compile_internal.h"

void ap__progress_init(struct ap__progress *p, const ap_compile_progress *to, double t0)
{
	memset(p, 0, sizeof(*p));
	p->t0 = t0;
	if (!to || !to->fn)
		return;
	if (pthread_mutex_init(&p->mu, NULL))
		return;   /* reports nothing rather than fail the request */
	p->to = to;
	p->ready = true;
}

void ap__progress_fini(struct ap__progress *p)
{
	if (p && p->ready)
		pthread_mutex_destroy(&p->mu);
	if (p) {
		p->ready = false;
		p->to = NULL;
	}
}

/* Whether `stage` was reported before (remembering it when not). */
static bool seen_before(struct ap__progress *p, const char *stage)
{
	for (unsigned i = 0; i < p->n_seen; i++)
		if (!strcmp(p->seen[i], stage))
			return true;
	if (p->n_seen < AP__PROGRESS_STAGES)
		p->seen[p->n_seen++] = stage;
	return false;
}

/* ap__progress with p->mu held. */
static void report_locked(struct ap__progress *p, const char *stage, uint32_t done,
			  uint32_t total)
{
	double now = ap_now_ms();
	bool same = p->stage && !strcmp(p->stage, stage);
	bool soon = now - p->last_ms < AP_PROGRESS_MIN_MS;

	/* within a stage: a counted one at most every AP_PROGRESS_MIN_MS
	 * (its last unit always), an uncounted one not again */
	if (same && (!total || done == p->last_done || (done < total && soon)))
		return;
	/* a stage reached again (the refusals' rounds, up to thousands):
	 * no more often than a counted stage's units */
	if (!same && seen_before(p, stage) && soon)
		return;
	p->stage = stage;
	p->last_done = done;
	p->last_ms = now;
	p->to->fn(p->to->user, stage, done, total, now - p->t0);
}

void ap__progress(struct ap__progress *p, const char *stage, uint32_t done, uint32_t total)
{
	if (!p || !p->to)
		return;
	pthread_mutex_lock(&p->mu);
	report_locked(p, stage, done, total);
	pthread_mutex_unlock(&p->mu);
}

void ap__progress_kernels(struct ap__progress *p, unsigned n)
{
	if (!p || !p->to || !n)
		return;
	pthread_mutex_lock(&p->mu);
	p->backend_done += n;
	if (p->backend_done > p->backend_total)
		p->backend_done = p->backend_total;
	report_locked(p, "backend", p->backend_done, p->backend_total);
	pthread_mutex_unlock(&p->mu);
}

/* The pipeline's stages (ap_pipeline_stage_name) as the wire names them. */
static const struct {
	const char *pipeline, *wire;
} stage_map[] = {
	{ "expand", "partition" },  { "partition", "partition" }, { "micro-graphs", "partition" },
	{ "layer I", "layer I" },   { "layer II", "layer II" },   { "emit", "tuning" },
	{ "layer III", "layer III" }, { "print", "codegen" },     { "plan", "plan" },
};

void ap__progress_stage(void *user, const char *stage)
{
	for (size_t i = 0; i < sizeof(stage_map) / sizeof(stage_map[0]); i++)
		if (!strcmp(stage, stage_map[i].pipeline)) {
			ap__progress(user, stage_map[i].wire, 0, 0);
			return;
		}
}

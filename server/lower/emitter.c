/* emitter.c -- the emitter registry and the lowering entry point (see
 * lower.h): pick the emitter, its configuration, build the kernel, add the
 * header comments, verify.
 */
#include "lower.h"
#include "emitters.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ap_emitter *const registry[] = {
	&ap_emitter_stitched,
	&ap_emitter_row_reduce,
	&ap_emitter_column_reduce,
	&ap_emitter_transpose,
	/* the product emitters before the movement emitter: a product whose
	 * output is concatenated keeps its tiled kernel (epilogue.c) */
	&ap_emitter_attention,
	&ap_emitter_attention_grad,
	&ap_emitter_gemm,
	&ap_emitter_depthwise,
	&ap_emitter_movement,
	&ap_emitter_pointwise,
};

const ap_emitter *const *ap_emitters(int *n)
{
	*n = (int)(sizeof(registry) / sizeof(registry[0]));
	return registry;
}

static int oom(ap_error *err, const ap_mgraph *m)
{
	return ap_error_set(err, AP_ENOMEM, m->g->n_nodes ? m->g->nodes[m->root].name : NULL, NULL,
			    "out of memory lowering a micro-graph");
}

int ap_bind(const ap_emitter *em, const ap_mgraph *m, const ap_target_info *t, ap_bound *b, char *why,
	    size_t cap)
{
	char own[200];
	void *an = NULL;
	int rc;

	if (!why || !cap) {
		why = own;
		cap = sizeof(own);
	}
	why[0] = 0;
	rc = em->bind(m, t, &an, why, cap);
	if (rc == 0 && !why[0])
		snprintf(why, cap, "the %s emitter does not build this micro-graph", em->name);
	*b = (ap_bound){em, m, t, rc > 0 ? an : NULL};
	if (rc <= 0 && an)   /* a declining bind keeps nothing */
		em->unbind ? em->unbind(an) : free(an);
	return rc;
}

void ap_unbind(ap_bound *b)
{
	if (b->an)
		b->em->unbind ? b->em->unbind(b->an) : free(b->an);
	b->an = NULL;
}

int ap_resolve(const ap_bound *b, const ap_sched *s, ap_plan *p)
{
	memset(p, 0, sizeof(*p));
	p->s = *s;
	return b->em->resolve ? b->em->resolve(b, s, p) : 1;
}

int ap_sched_valid(const ap_bound *b, const ap_sched *s)
{
	ap_plan p;

	return ap_resolve(b, s, &p);
}

int ap_traffic_of(const ap_bound *b, const ap_sched *s, ap_traffic *out)
{
	ap_plan p;

	if (ap_resolve(b, s, &p) < 0)
		return AP_ENOMEM;
	return b->em->traffic(b, &p, out);
}

int ap_bind_first(const ap_mgraph *m, const ap_target_info *t, ap_bound *b, ap_error *err)
{
	int n;
	const ap_emitter *const *r = ap_emitters(&n);

	for (int i = 0; i < n; i++) {
		int rc = ap_bind(r[i], m, t, b, NULL, 0);

		if (rc < 0)
			return oom(err, m);
		if (rc > 0)
			return 0;
	}
	/* pointwise binds every micro-graph: a refusal is an allocation's */
	return oom(err, m);
}

int ap_emitter_default(const ap_bound *b, ap_space *sp, ap_sched *s, ap_error *err)
{
	memset(sp, 0, sizeof(*sp));
	memset(s, 0, sizeof(*s));
	if (b->em->space(b, sp) < 0)
		return oom(err, b->m);
	s->em = b->em;
	s->n = sp->n;
	for (int i = 0; i < sp->n; i++)
		s->v[i] = sp->knobs[i].values[0];
	if (b->em->choose(b, sp, s) < 0)
		return oom(err, b->m);
	return 0;
}

char *ap_sched_describe(const ap_bound *b, const ap_sched *s)
{
	ap_space sp;
	char buf[256] = "";
	size_t len = 0;

	memset(&sp, 0, sizeof(sp));
	if (b->em->space(b, &sp) < 0)
		return NULL;
	for (int i = 0; i < sp.n && i < s->n && len + 32 < sizeof(buf); i++)
		len += (size_t)snprintf(buf + len, sizeof(buf) - len, "%s%s=%d", i ? " " : "",
					sp.knobs[i].name, s->v[i]);
	return ap_strdup(buf);
}

int ap_sched_parse(const ap_bound *b, const char *text, ap_sched *s)
{
	const ap_emitter *em = b->em;
	ap_space sp;
	bool set[AP_SPACE_MAX_KNOBS] = {false};
	const char *p = text;

	memset(&sp, 0, sizeof(sp));
	memset(s, 0, sizeof(*s));
	if (!text || em->space(b, &sp) < 0)
		return text ? AP_ENOMEM : 0;
	s->em = em;
	s->n = sp.n;
	while (*p) {
		const char *eq = strchr(p, '=');
		char *end;
		long v;
		int k = -1;

		if (*p == ' ') {
			p++;
			continue;
		}
		if (!eq)
			return 0;
		for (int i = 0; i < sp.n; i++)
			if (strlen(sp.knobs[i].name) == (size_t)(eq - p) &&
			    !strncmp(sp.knobs[i].name, p, (size_t)(eq - p)))
				k = i;
		if (k < 0 || set[k] || eq[1] < '0' || eq[1] > '9')
			return 0;
		v = strtol(eq + 1, &end, 10);
		if (*end && *end != ' ')
			return 0;
		for (int j = 0; j < sp.knobs[k].n && !set[k]; j++)
			if (sp.knobs[k].values[j] == v) {
				s->v[k] = (int)v;
				set[k] = true;
			}
		if (!set[k])
			return 0;
		p = end;
	}
	for (int i = 0; i < sp.n; i++) {
		if (!set[i] && !sp.knobs[i].late)
			return 0;
		if (!set[i])
			s->v[i] = sp.knobs[i].values[0];
	}
	return ap_sched_valid(b, s);
}

int ap_sched_get(const ap_sched *s, const ap_space *sp, const char *name, int dflt)
{
	for (int i = 0; i < sp->n && i < s->n; i++)
		if (strcmp(sp->knobs[i].name, name) == 0)
			return s->v[i];
	return dflt;
}

/* ---- the header of comments ---------------------------------------------------- */

static void shape_text(const ap_tensor *t, char *buf, size_t cap)
{
	size_t len = 0;

	buf[len++] = '[';
	for (int i = 0; i < t->rank && len + 24 < cap; i++)
		len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? "," : "",
					(long long)t->dims[i]);
	buf[len++] = ']';
	buf[len] = 0;
}

/* Prepends comments naming the emitter and configuration, the fused ops
 * and what each parameter holds.  No graph names: the kernel is named
 * after its content, so the same kernel in two graphs must print the same
 * (ap_kernel_src lists the nodes and parameters by name). */
static void add_header(ap_kir_kernel *k, const ap_mgraph *m, const ap_sched *s, const ap_space *sp)
{
	ap_kir_block hdr = {NULL, NULL};
	char ops[200] = "", cfg[200] = "";
	size_t len = 0;

	for (int i = 0; i < m->g->n_nodes && len + 40 < sizeof(ops); i++)
		len += (size_t)snprintf(ops + len, sizeof(ops) - len, " %s",
					ap_op_name(m->g->nodes[i].op));
	len = 0;
	for (int i = 0; i < sp->n && len + 40 < sizeof(cfg); i++)
		len += (size_t)snprintf(cfg + len, sizeof(cfg) - len, " %s=%d", sp->knobs[i].name,
					s->v[i]);
	ap_kir_comment(k, &hdr, "%s micro-graph:%s", ap_group_kind_name(m->kind), ops);
	ap_kir_comment(k, &hdr, "emitter %s:%s", s->em->name, cfg);
	for (int i = 0; i < k->n_arrays; i++) {
		const ap_kir_array *a = k->arrays[i];
		char sh[128];

		if (a->space != AP_KIR_GLOBAL)
			continue;
		shape_text(&m->g->tensors[a->tensor], sh, sizeof(sh));
		ap_kir_comment(k, &hdr, "%s: %s %s %s", a->name, a->written ? "writes" : "reads",
			       ap_dtype_name(a->type), sh);
	}
	if (hdr.first) {
		hdr.last->next = k->body.first;
		k->body.first = hdr.first;
		if (!k->body.last)
			k->body.last = hdr.last;
	}
}

__ap_give ap_kir_kernel *ap_lower(const ap_bound *b, const char *name, const ap_lower_options *opt,
				  ap_sched *used, ap_error *err)
{
	const ap_emitter *em = b->em;
	const ap_mgraph *m = b->m;
	const ap_target_info *t = b->t;
	ap_space sp;
	ap_sched s;
	ap_plan plan;
	ap_kir_kernel *k;
	int rc;

	if (opt && opt->sched && opt->sched->em) {
		if (opt->sched->em != em) {
			ap_error_set(err, AP_EINTERNAL, m->g->nodes[m->root].name, NULL,
				     "a configuration of emitter %s for a micro-graph bound to %s",
				     opt->sched->em->name, em->name);
			return NULL;
		}
		memset(&sp, 0, sizeof(sp));
		if (em->space(b, &sp) < 0) {
			oom(err, m);
			return NULL;
		}
		s = *opt->sched;
	} else if (ap_emitter_default(b, &sp, &s, err) < 0) {
		return NULL;
	}
	k = ap_kir_kernel_new(name);
	if (!k) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering a micro-graph");
		return NULL;
	}
	k->index_type = ap_index_type_for(m->g);
	/* the plan's decisions, whether or not it fits: the emitter refuses
	 * one that does not (AP_EUNSUPPORTED, naming what) */
	if (ap_resolve(b, &s, &plan) < 0) {
		ap_kir_kernel_free(k);
		oom(err, m);
		return NULL;
	}
	rc = em->emit(b, &plan, k, err);
	if (rc)
		return ap_kir_kernel_free(k);
	add_header(k, m, &s, &sp);
	/* each parameter's extent: the elements of its tensor, what the kernel
	 * may touch (the host printer exports them; the runtime checks bound
	 * buffers against them) */
	for (int i = 0; i < k->n_arrays; i++)
		if (k->arrays[i]->space == AP_KIR_GLOBAL && k->arrays[i]->tensor >= 0 &&
		    k->arrays[i]->tensor < m->g->n_tensors)
			k->arrays[i]->size = ap_tensor_numel(&m->g->tensors[k->arrays[i]->tensor]);
	if (ap_kir_failed(k)) {
		ap_error_set(err, AP_ENOMEM, m->g->nodes[m->root].name, NULL,
			     "out of memory lowering a micro-graph");
		return ap_kir_kernel_free(k);
	}
	if (opt && opt->verify) {
		ap_kir_limits lim = {1024, t->shared_optin_per_block > t->shared_per_block
					   ? t->shared_optin_per_block : t->shared_per_block};
		ap_error verr;

		if ((rc = ap_kir_verify(k, &lim, &verr)) != 0) {
			if (rc == AP_ENOMEM)
				oom(err, m);
			else
				ap_error_set(err, AP_EINTERNAL, m->g->nodes[m->root].name, NULL,
					     "emitter %s built an invalid kernel: %s", em->name, verr.msg);
			return ap_kir_kernel_free(k);
		}
	}
	if (used)
		*used = s;
	return k;
}

__ap_give ap_kir_kernel *ap_lower_mgraph(const ap_mgraph *m, const ap_target_info *t, const char *name,
					 const ap_lower_options *opt, ap_sched *used, ap_error *err)
{
	ap_bound b;
	ap_kir_kernel *k;
	char why[200];
	int rc;

	if (opt && opt->sched && opt->sched->em) {
		if ((rc = ap_bind(opt->sched->em, m, t, &b, why, sizeof(why))) <= 0) {
			if (rc < 0)
				oom(err, m);
			else
				ap_error_set(err, AP_EUNSUPPORTED, m->g->nodes[m->root].name, NULL,
					     "emitter %s refuses this micro-graph: %s", opt->sched->em->name, why);
			return NULL;
		}
	} else if (ap_bind_first(m, t, &b, err) < 0) {
		return NULL;
	}
	k = ap_lower(&b, name, opt, used, err);
	ap_unbind(&b);
	return k;
}

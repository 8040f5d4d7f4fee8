/* conv.c -- what the two convolution emitters (gemm.c's implicit GEMM,
 * depthwise.c) check alike about a Conv / ConvTranspose node before each
 * sizes it its own way.  Declared in emitters.h.
 */
#include "emitters.h"

#include <stdio.h>

int ap__conv_ops(const ap_graph *g, int node, int max_ns, ap_conv_ops *c, char *why, size_t cap)
{
	const ap_node *n = &g->nodes[node];
	const ap_tensor *xt, *wt, *yt;

	if (n->n_inputs < 2 || n->inputs[0] < 0 || n->inputs[1] < 0 || n->n_outputs < 1 || n->outputs[0] < 0) {
		snprintf(why, cap, "a convolution without its operands");
		return 0;
	}
	c->x = n->inputs[0];
	c->w = n->inputs[1];
	c->bias = n->n_inputs > 2 ? n->inputs[2] : -1;
	c->y = n->outputs[0];
	xt = &g->tensors[c->x];
	wt = &g->tensors[c->w];
	yt = &g->tensors[c->y];
	c->ns = xt->rank - 2;
	if (c->ns < 1 || c->ns > max_ns || wt->rank != xt->rank || yt->rank != xt->rank) {
		snprintf(why, cap, "a convolution of rank %d", xt->rank);
		return 0;
	}
	if (!ap_kir_is_float_type(xt->dtype) || wt->dtype != xt->dtype || yt->dtype != xt->dtype ||
	    (c->bias >= 0 && g->tensors[c->bias].dtype != xt->dtype)) {
		snprintf(why, cap, "operands of type %s", ap_dtype_name(xt->dtype));
		return 0;
	}
	c->in_t = xt->dtype;
	c->acc_t = xt->dtype == AP_DT_F64 ? AP_DT_F64 : AP_DT_F32;
	c->C = xt->dims[1];
	c->M = yt->dims[1];
	c->groups = ap_node_int(n, "group", 1);
	if (c->groups < 1 || c->C % c->groups || c->M % c->groups) {
		snprintf(why, cap, "group %lld", (long long)c->groups);
		return 0;
	}
	c->Cg = c->C / c->groups;
	c->Mg = c->M / c->groups;
	return 1;
}

/* dump.c -- the partition as text and as JSON (APOLLO, MLSys 2022,
 * section 3: the partition is explicit data, so it can be dumped,
 * explained and replayed; STYLE.md, "replayable decisions").
 *
 * In: a built partition.  Out: one line per group then one per boundary
 * (ap_partition_dump), or one JSON object (ap_partition_dump_json); the
 * formats are in partition.h.
 */
#include "partition_internal.h"

/* "name:dtype[d0,d1,...]" of tensor t. */
static void dump_tensor(FILE *f, const ap_graph *g, int t)
{
	const ap_tensor *x = &g->tensors[t];

	fprintf(f, "%s:%s[", x->name, ap_dtype_name(x->dtype));
	for (int i = 0; i < x->rank; i++)
		fprintf(f, "%s%lld", i ? "," : "", (long long)x->dims[i]);
	fprintf(f, "]");
}

/* One line per group, then one per boundary (partition.h). */
int ap_partition_dump(const ap_partition *p, FILE *f)
{
	const ap_graph *g = p->g;

	for (int i = 0; i < p->n_groups; i++) {
		const ap_group *grp = &p->groups[i];

		fprintf(f, "group %d %s sub=%d root=%s(%s) nodes=[", i, ap_group_kind_name(grp->kind),
			grp->subgraph, ap_op_name(g->nodes[grp->root].op), g->nodes[grp->root].name);
		for (int j = 0; j < grp->n_nodes; j++)
			fprintf(f, "%s%s(%s)", j ? " " : "", ap_op_name(g->nodes[grp->nodes[j]].op),
				g->nodes[grp->nodes[j]].name);
		fprintf(f, "] views=[");
		for (int j = 0; j < grp->n_views; j++)
			fprintf(f, "%s%s(%s)", j ? " " : "", ap_op_name(g->nodes[grp->views[j]].op),
				g->nodes[grp->views[j]].name);
		fprintf(f, "] out=[");
		for (int j = 0; j < grp->n_outputs; j++) {
			fprintf(f, "%s", j ? " " : "");
			dump_tensor(f, g, grp->outputs[j]);
		}
		fprintf(f, "] in=[");
		for (int j = 0; j < grp->n_inputs; j++) {
			fprintf(f, "%s", j ? " " : "");
			dump_tensor(f, g, grp->inputs[j]);
		}
		fprintf(f, "]\n");
	}
	for (int i = 0; i < p->n_boundaries; i++) {
		const ap_boundary *b = &p->boundaries[i];

		fprintf(f, "edge %d -> %d %s: %s\n", p->group_of[b->producer], p->group_of[b->consumer],
			g->tensors[b->tensor].name, b->detail);
	}
	return ferror(f) ? AP_EIO : 0;
}

/* The same as one JSON object (partition.h). */
int ap_partition_dump_json(const ap_partition *p, FILE *f)
{
	const ap_graph *g = p->g;

	fprintf(f, "{\"level\":\"%s\",\"groups\":[", ap_fuse_level_name(p->level));
	for (int i = 0; i < p->n_groups; i++) {
		const ap_group *grp = &p->groups[i];

		fprintf(f, "%s{\"kind\":\"%s\",\"subgraph\":%d,\"root\":", i ? "," : "",
			ap_group_kind_name(grp->kind), grp->subgraph);
		ap__json_string(f, g->nodes[grp->root].name);
		fprintf(f, ",\"nodes\":[");
		for (int j = 0; j < grp->n_nodes; j++) {
			fprintf(f, "%s", j ? "," : "");
			ap__json_string(f, g->nodes[grp->nodes[j]].name);
		}
		fprintf(f, "],\"ops\":[");
		for (int j = 0; j < grp->n_nodes; j++)
			fprintf(f, "%s\"%s\"", j ? "," : "", ap_op_name(g->nodes[grp->nodes[j]].op));
		fprintf(f, "],\"outputs\":[");
		for (int j = 0; j < grp->n_outputs; j++) {
			fprintf(f, "%s", j ? "," : "");
			ap__json_string(f, g->tensors[grp->outputs[j]].name);
		}
		fprintf(f, "],\"inputs\":[");
		for (int j = 0; j < grp->n_inputs; j++) {
			fprintf(f, "%s", j ? "," : "");
			ap__json_string(f, g->tensors[grp->inputs[j]].name);
		}
		fprintf(f, "]}");
	}
	fprintf(f, "],\"boundaries\":[");
	for (int i = 0; i < p->n_boundaries; i++) {
		const ap_boundary *b = &p->boundaries[i];

		fprintf(f, "%s{\"producer\":%d,\"consumer\":%d,\"tensor\":", i ? "," : "",
			p->group_of[b->producer], p->group_of[b->consumer]);
		ap__json_string(f, g->tensors[b->tensor].name);
		fprintf(f, ",\"reason\":\"%s\",\"detail\":", ap_boundary_reason_key(b->reason));
		ap__json_string(f, b->detail);
		fprintf(f, "}");
	}
	fprintf(f, "],\"subgraphs\":[");
	for (int i = 0; i < p->n_subgraphs; i++) {
		fprintf(f, "%s{\"wave\":%d,\"deps\":[", i ? "," : "", p->subgraphs[i].wave);
		for (int j = 0; j < p->subgraphs[i].n_deps; j++)
			fprintf(f, "%s%d", j ? "," : "", p->subgraphs[i].deps[j]);
		fprintf(f, "]}");
	}
	fprintf(f, "]}\n");
	return ferror(f) ? AP_EIO : 0;
}

/* plan.h -- the plan stage of the pipeline (internal to server/): from
 * launches bound to tensors to the launch plan proper.
 *
 * The driver (server/driver/pipeline.c) fills ap_program.kernels and
 * ap_program.launches with each launch's args holding *program-graph
 * tensor indices* (one per kernel parameter); the plan stage turns those
 * into buffers, lays out the workspace and adds the traffic and explain
 * data.
 */
#ifndef AP_PLAN_H
#define AP_PLAN_H

#include "program.h"

/* Buffers: every graph input (INPUT, by position), every graph output
 * (OUTPUT, by position), every PARAM tensor a launch binds (PARAM, by
 * name) and every other tensor a launch binds (INTERMEDIATE); rewrites
 * each launch's args from tensors of `pg` to buffer indices; sets each
 * launch's global_bytes (every distinct buffer it binds, once) and each
 * kernel's (of its first launch); places intermediates in one workspace
 * by liveness (first fit, 256-byte aligned); fills eager_kernels,
 * eager_bytes (of `orig`, the graph before expansion), min_bytes (the
 * floor, over pg's readers) and global_bytes, and the memory figures
 * (input_bytes, output_bytes, const_bytes, peak_bytes).  0 or AP_ENOMEM
 * with `err` set. */
int ap__plan_buffers(ap_program *p, __ap_keep const ap_graph *pg, __ap_keep const ap_graph *orig,
		     ap_error *err);

/* Explain data: sub-graphs and waves, the expansion registry's choices
 * (nodes of `orig`), and one boundary per (producer launch, consumer
 * launch, tensor) from the partition's boundaries, launch_of[gi] giving
 * the launch of partition group gi (-1: none).  0 or AP_ENOMEM. */
int ap__plan_explain(ap_program *p, __ap_keep const ap_partition *part,
		     __ap_keep const ap_graph *orig, __ap_keep const ap_expand_choices *choices,
		     const int *launch_of);

/* Frees the contents of one kernel / launch (not the struct itself). */
void ap__kernel_src_clear(ap_kernel_src *k);
void ap__launch_clear(ap_launch *l);

#endif

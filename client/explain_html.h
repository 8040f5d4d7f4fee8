/* explain_html.h -- a bundle's fused graph as one self-contained HTML page
 * (`apollo-client submit --explain-html FILE`, the torch backend's
 * explain_html option): every launch a box holding its ONNX nodes,
 * coloured by its emitter (else its category) and outlined by the fusion
 * layers that built it (I, II, III); every boundary between launches an
 * arrow from producer to consumer labelled with its reason.  Launches are
 * laid out top-down in rows by their depth in the launch graph (a launch
 * sits one row below the deepest launch it reads from), in launch order
 * within a row; the layout is computed here and drawn as an inline SVG.
 * Hovering a launch shows its kernel, schedule, bytes and recompute ratio
 * (an SVG <title> and a panel the page's script fills).
 *
 * The page needs nothing else: inline CSS and JavaScript, no fonts, images
 * or links, and a Content-Security-Policy that forbids every fetch.  Every
 * string from the bundle (node, kernel and tensor names, reasons,
 * schedules) is HTML-escaped and never reaches the script as code: the
 * script reads data-* attributes and writes text nodes only.
 *
 * For tests and tools the page carries its counts:
 *   <svg id="graph" data-launches="N" data-boundaries="M" ...>
 *   <g class="launch kind-K layer-L" data-index="I" ...>   one per launch
 *   <g class="boundary reason-R" data-producer="P" data-consumer="C">   one
 *     per boundary whose launches exist (M counts those)
 *   <p id="counts" data-rendered-launches data-rendered-boundaries>, which the
 *     script fills from the DOM once the page has loaded.
 */
#ifndef AP_CLIENT_EXPLAIN_HTML_H
#define AP_CLIENT_EXPLAIN_HTML_H

#include <stdio.h>

#include "apollo.h"
#include "tool.h"

/* Writes the page for bundle `b` to `f` (borrowed; not closed).  `info`
 * (may be NULL) gives the page's title (info->model) and the client-side
 * times shown in its summary; info->explain is not read (the page always
 * holds every launch and boundary).  Returns 0, or AP_ENOMEM (nothing
 * useful written), or AP_EIO when writing to `f` failed; `err` (may be
 * NULL) says which. */
int ap_report_html(FILE *f, const ap_bundle *b, const ap_report_info *info, ap_error *err);

/* ap_report_html into the file `path` (created or truncated, mode 0666
 * less the umask), titled `model` (may be NULL): the form a binding calls
 * (client/python/apollo, ctypes).  0, or AP_EIO naming the path and the
 * system's reason, AP_ENOMEM, AP_EINVAL (a NULL path or bundle); on an
 * error after opening, the partial file is removed. */
int ap_report_html_file(const char *path, const ap_bundle *b, const char *model, ap_error *err);

#endif

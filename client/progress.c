/* progress.c -- `apollo-client submit --progress`: the daemon's stage
 * events (ap_client_set_progress) as a live line on a terminal, or as
 * plain lines in a log.  What comes in: one call per event, in order, on
 * the submitting thread.  What goes out: text on the line's FILE (stderr),
 * flushed per event so that it shows while the compile runs.  The
 * invariant: a redrawn line is always ended (ap_progress_done) before
 * anything else is printed.
 */
#include "tool.h"

#include <string.h>

void ap_progress_print(void *user, const char *stage, unsigned done, unsigned total,
		       double elapsed_ms)
{
	ap_progress_line *p = user;
	char count[48] = "";

	if (!p || !p->f)
		return;
	if (total)
		snprintf(count, sizeof(count), " %u/%u%s", done, total,
			 strcmp(stage, "backend") ? "" : " kernels");
	if (p->tty) {
		/* \r and ESC[K: back to the line's start, then clear it */
		fprintf(p->f, "\r\033[Kapollo-client: %s%s (%.1f s)", stage, count, elapsed_ms / 1e3);
		p->drawn = true;
	} else {
		fprintf(p->f, "progress: %s%s (%.0f ms)\n", stage, count, elapsed_ms);
	}
	p->events++;
	fflush(p->f);
}

void ap_progress_done(ap_progress_line *p)
{
	if (!p || !p->f || !p->drawn)
		return;
	fputc('\n', p->f);
	fflush(p->f);
	p->drawn = false;
}

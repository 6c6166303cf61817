/* worker/cli/cmd_batch.c - placeholder until the batching engine lands. */
#include <stdio.h>
#include "cmds.h"
int cmd_run_batch(int argc, char **argv) { fprintf(stderr, "run --batch: not built yet\n"); return 1; }

/* worker/cli/cmd_engine.c - placeholder until the engine commands land. */
#include <stdio.h>
#include "cmds.h"
int cmd_logits(int argc, char **argv) { fprintf(stderr, "logits: not built yet\n"); return 1; }
int cmd_run(int argc, char **argv) { fprintf(stderr, "run: not built yet\n"); return 1; }
int cmd_bench_engine(int argc, char **argv) { fprintf(stderr, "bench-engine: not built yet\n"); return 1; }

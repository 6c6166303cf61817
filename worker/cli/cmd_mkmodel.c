/* worker/cli/cmd_mkmodel.c - placeholder until the model maker lands. */
#include <stdio.h>
#include "cmds.h"
int cmd_mkmodel(int argc, char **argv) { fprintf(stderr, "mkmodel: not built yet\n"); return 1; }

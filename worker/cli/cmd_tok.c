/* worker/cli/cmd_tok.c - placeholder until the tokenizer lands. */
#include <stdio.h>
#include "cmds.h"
int cmd_tokenize(int argc, char **argv) { fprintf(stderr, "tokenize: not built yet\n"); return 1; }
int cmd_detokenize(int argc, char **argv) { fprintf(stderr, "detokenize: not built yet\n"); return 1; }
int cmd_template(int argc, char **argv) { fprintf(stderr, "template: not built yet\n"); return 1; }

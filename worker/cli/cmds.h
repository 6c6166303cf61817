/* worker/cli/cmds.h - the subcommands of build/redlm. Each takes the
 * arguments after its name (argv[0] is the subcommand), prints its result
 * as JSON on stdout, errors on stderr, and returns the process exit code. */
#ifndef RL_CLI_CMDS_H
#define RL_CLI_CMDS_H

int cmd_enqueue(int argc, char **argv);      /* cmd_client.c */
int cmd_tail(int argc, char **argv);         /* cmd_client.c */
int cmd_cancel(int argc, char **argv);       /* cmd_client.c */
int cmd_chat(int argc, char **argv);         /* cmd_client.c */
int cmd_stats(int argc, char **argv);        /* cmd_stats.c */
int cmd_lora(int argc, char **argv);         /* cmd_lora.c */
int cmd_top(int argc, char **argv);          /* cmd_stats.c */

int cmd_logits(int argc, char **argv);       /* cmd_engine.c */
int cmd_run(int argc, char **argv);          /* cmd_engine.c */
/* `redlm run --batch FILE.jsonl ...`: cmd_run hands over when --batch is given */
int cmd_run_batch(int argc, char **argv);    /* cmd_batch.c */
int cmd_bench_engine(int argc, char **argv); /* cmd_engine.c */
/* run / bench-engine with --speculative: through the batching engine */
int cmd_run_spec(int argc, char **argv);     /* cmd_spec.c */
int cmd_bench_spec(int argc, char **argv);   /* cmd_spec.c */
/* bench-engine with --json-schema: free vs constrained decoding */
int cmd_bench_structured(int argc, char **argv); /* cmd_structured.c */
int cmd_mkmodel(int argc, char **argv);      /* cmd_mkmodel.c */
int cmd_tokenize(int argc, char **argv);     /* cmd_tok.c */
int cmd_detokenize(int argc, char **argv);   /* cmd_tok.c */
int cmd_template(int argc, char **argv);     /* cmd_tok.c */
int cmd_loadbench(int argc, char **argv);    /* cmd_loadbench.c: `redlm bench` */

#endif

/* worker/cli/main.c - build/redlm, the multi-tool: one table of
 * subcommands, each in its own file. */
#include <stdio.h>
#include <string.h>

#include "cmds.h"

struct cli_cmd {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
};

static const struct cli_cmd cmds[] = {
    {"enqueue", cmd_enqueue, "--message TEXT | --file F [--pool P] ...: send a job, print its id"},
    {"tail", cmd_tail, "ID [--json]: follow a request's events"},
    {"cancel", cmd_cancel, "ID...: cancel requests"},
    {"chat", cmd_chat, "[--mode M] [--pool P]: chat in the terminal through the queue"},
    {"stats", cmd_stats, "[--json]: workers, dispatchers, pools, dead letters"},
    {"top", cmd_top, "the same, live (q quits)"},
    {"lora", cmd_lora, "load NAME PATH | unload NAME | list: runtime LoRA adapters of the fleet"},
    {"logits", cmd_logits, "-m DIR --tokens 1,2,3 [--all]: print logits as JSON"},
    {"run", cmd_run, "-m DIR --tokens 1,2,3 -n N [--temperature 0] [--ignore-eos]: generate"},
    {"bench-engine", cmd_bench_engine, "-m DIR --prompt P --gen G --batch B [--speculative oracle|ngram] [--json-schema FILE]: engine speed"},
    {"mkmodel", cmd_mkmodel, "--out DIR --shape NAME|... --dtype f32|bf16|fp8|awq|q8_0|q4_k_m|...: random checkpoint"},
    {"tokenize", cmd_tokenize, "--tokenizer DIR (--text S | --file F): print ids"},
    {"detokenize", cmd_detokenize, "--tokenizer DIR --ids 1,2,3 [--skip-special]: print text"},
    {"template", cmd_template, "--tokenizer DIR --messages F.json [--tools T.json] [--no-think]"},
    {"bench", cmd_loadbench, "--redis ADDR --clients N|--rate R [--sweep ...]: load a deployment"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: redlm COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        fprintf(f, "  %-13s %s\n", cmds[i].name, cmds[i].help);
    fprintf(f, "\nevery command takes --threads N where it computes; "
               "`redlm COMMAND --help` for details\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name))
            return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "redlm: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

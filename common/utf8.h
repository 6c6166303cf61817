/* common/utf8.h - strict UTF-8 validation (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF), the one check for every text that
 * must be UTF-8: a job's text (job.c), the tokenizer's input (its
 * replacement of invalid bytes starts where this stops) and a constraint's
 * schema (engine/grammar). */
#ifndef RL_UTF8_H
#define RL_UTF8_H

#include <stddef.h>

/* The length of the longest valid prefix of s[0..len): len when all of it
 * is valid, else the offset of the first byte of the first invalid (or
 * unfinished) sequence. */
size_t utf8_valid_len(const void *s, size_t len);

#endif

/*
 * A small streaming JSON writer for loom-perf's -J file: values are written as they come, commas
 * and nesting tracked here, strings escaped (control characters as \u00XX).
 */
#ifndef LOOM_PERF_JSON_H
#define LOOM_PERF_JSON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define JW_DEPTH 16

typedef struct {
    FILE *f;
    int depth;
    bool some[JW_DEPTH]; /* the container at this depth has a value already */
} jw_t;

/* key is NULL for list items and the top-level value */
void jw_obj(jw_t *w, const char *key);
void jw_list(jw_t *w, const char *key);
void jw_end(jw_t *w, char close); /* '}' or ']' */
void jw_str(jw_t *w, const char *key, const char *v);
void jw_int(jw_t *w, const char *key, long long v);
void jw_u64(jw_t *w, const char *key, uint64_t v);
void jw_double(jw_t *w, const char *key, double v); /* NaN and infinities as strings */
void jw_null(jw_t *w, const char *key);
void jw_bool_str(jw_t *w, const char *key, bool v); /* "true"/"false", as nccl-tests writes */

#endif

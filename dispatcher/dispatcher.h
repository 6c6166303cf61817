/* dispatcher/dispatcher.h - what the dispatcher offers its other threads
 * (the HTTP front door, dispatcher/http.c): its counters as Prometheus
 * text, and whether it is ready. The struct behind the handle is the
 * dispatcher's own (dispatcher/disp.h); these two calls take its metrics
 * mutex and may be made from any thread while the main loop runs. */
#ifndef RL_DISPATCHER_H
#define RL_DISPATCHER_H

#include <stdbool.h>

struct disp;

/* Prometheus text exposition (version 0.0.4) of the dispatcher's
 * counters: requests routed per pool (and auto ones per pool), cache
 * hits/misses, invalid and overloaded requests, the configured and
 * effective think ratio, each pool's waiting jobs and queue wait, requests
 * per second. malloc'd; the caller frees it. NULL when out of memory. */
char *disp_metrics_text(struct disp *d);

/* Connected to Redis and the consumer groups made: requests are being
 * routed. */
bool disp_ready(struct disp *d);

/* The models served, as the JSON array of OpenAI model objects
 * ([{"id", "object": "model", "created", "owned_by"}...]) that /v1/models
 * lists: the dispatcher's served_model_name when set, else the models
 * live workers announce in their heartbeats (at most one heartbeat
 * interval old). malloc'd; the caller frees it. NULL when out of memory. */
char *disp_models_json(struct disp *d);

#endif

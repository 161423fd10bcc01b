/*
 * admin.h - administration through the daemon (docs/operations.md,
 * "Tenants and tokens"): the Admin* RPCs of topos.v1.Topos add, list and
 * remove tenants, create, list and revoke tokens, and set and show a
 * tenant's quotas, with the store functions `topos --store PATH` uses.
 *
 * Who may call them: a tenant whose admin flag is set (any other tenant is
 * PERMISSION_DENIED, and nothing changes), or anyone on a daemon without
 * tenants (auth off, loopback only: anyone there can edit the store file
 * too).  Every call writes one audit line to the daemon's log
 * (event=audit: the action, what it names, the caller's tenant and peer;
 * never a secret).
 */
#ifndef TOPOSD_ADMIN_H
#define TOPOSD_ADMIN_H

#include "handlers.h"

void handle_admin_tenant_add(call_ctx *cx);
void handle_admin_tenant_list(call_ctx *cx);
void handle_admin_tenant_remove(call_ctx *cx);
void handle_admin_token_create(call_ctx *cx);
void handle_admin_token_list(call_ctx *cx);
void handle_admin_token_revoke(call_ctx *cx);
void handle_admin_quota_set(call_ctx *cx);
void handle_admin_quota_show(call_ctx *cx);
void handle_admin_spec_delete(call_ctx *cx);

#endif /* TOPOSD_ADMIN_H */

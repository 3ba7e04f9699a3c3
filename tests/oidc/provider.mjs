// A real OpenID Provider for the OIDC sign-in tests: panva's oidc-provider (OpenID Certified),
// configured here, on loopback. The Rust integration tests (appliance/tests/integration/oidc.rs)
// and the Chromium test (tests/browser/oidc.test.mjs) start it with a JSON config file:
//
//   node provider.mjs config.json
//   {"issuer": "http://127.0.0.1:PORT", "port": PORT,
//    "kids": ["k1"],                                   // one fresh RSA-2048 key per kid (RS256)
//    "clients": [{"client_id", "client_secret", "redirect_uris": [...],
//                 "id_token_signed_response_alg": "RS256" | "HS256",   // optional
//                 "id_token_ttl": 300}],                               // optional, seconds
//    "accounts": {"alice": {"groups": ["analysts"], "preferred_username": "alice"}},
//    "clock_offset_secs": 0}                                            // optional
//
// Sign-in uses the provider's own development interactions: its login form accepts any
// password for an account listed in "accounts" (the account id is the login); consent is granted
// for the registered clients (first-party). It prints "listening PORT" when it serves.
import { generateKeyPairSync } from 'node:crypto';
import { readFileSync } from 'node:fs';

import Provider from 'oidc-provider';

const cfg = JSON.parse(readFileSync(process.argv[2], 'utf8'));

// "clock_offset_secs": this provider's clock runs that far off (an IdP without NTP): every
// time it issues or checks is shifted, so e.g. -7200 makes it issue ID tokens that expired
// before they were sent.
if (cfg.clock_offset_secs) {
  const realNow = Date.now;
  Date.now = () => realNow() + cfg.clock_offset_secs * 1000;
}

const keys = (cfg.kids ?? ['k1']).map((kid) => {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  return { ...privateKey.export({ format: 'jwk' }), kid, alg: 'RS256', use: 'sig' };
});

const ttlOf = new Map(cfg.clients.map((c) => [c.client_id, c.id_token_ttl ?? 300]));

const provider = new Provider(cfg.issuer, {
  clients: cfg.clients.map((c) => ({
    client_id: c.client_id,
    client_secret: c.client_secret,
    redirect_uris: c.redirect_uris,
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
    id_token_signed_response_alg: c.id_token_signed_response_alg ?? 'RS256',
  })),
  jwks: { keys },
  // HS256 too, for the client that asks for it (the tests prove Airlock refuses it).
  enabledJWA: { idTokenSigningAlgValues: ['RS256', 'HS256'] },
  cookies: { keys: ['airlock-test-provider-cookie-key'] },
  claims: {
    openid: ['sub'],
    profile: ['preferred_username', 'name'],
    groups: ['groups'],
  },
  scopes: ['openid', 'profile', 'groups'],
  // The groups go into the ID token (as Keycloak's and Entra's group claims do).
  conformIdTokenClaims: false,
  pkce: { required: () => true },
  ttl: {
    AccessToken: 600,
    AuthorizationCode: 60,
    Grant: 3600,
    IdToken: (_ctx, _token, client) => ttlOf.get(client.clientId) ?? 300,
    Interaction: 600,
    Session: 3600,
  },
  async findAccount(_ctx, id) {
    const account = cfg.accounts[id];
    if (!account) return undefined;
    return { accountId: id, claims: async () => ({ sub: id, ...account }) };
  },
  // First-party clients: consent is given (the dev interactions still ask for the login).
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId
      || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope('openid profile groups');
    grant.addOIDCClaims(['preferred_username', 'name', 'groups']);
    await grant.save();
    return grant;
  },
});

provider.on('server_error', (_ctx, err) => console.error('server_error', err));

const server = provider.listen(cfg.port, '127.0.0.1', () => {
  console.log(`listening ${server.address().port}`);
});

for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => server.close(() => process.exit(0)));
}

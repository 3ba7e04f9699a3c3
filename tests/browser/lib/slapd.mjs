// A real OpenLDAP slapd for the browser sign-in test, the way the daemon's own tests start one
// (appliance/tests/integration/slapd.rs): a temporary directory with a generated cn=config
// (slapadd -n0, no system service) and a generated directory (slapadd -n1), ldaps:// on a
// loopback port with a server certificate from a test CA made with openssl.
//
// The directory (dc=bank,dc=test): the service account cn=airlock,ou=services; people alice
// (group analysts) and bob (group risk), each with the password `<uid>-pw`; groupOfNames
// under ou=groups.

import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

import { freePort } from './daemon.mjs';

export const BASE = 'dc=bank,dc=test';
const ROOT_DN = `cn=admin,${BASE}`;
const ROOT_PW = 'root-secret-pw';
export const SERVICE_DN = `cn=airlock,ou=services,${BASE}`;
const SERVICE_PW = 'service-secret-pw';

function find(cmd) {
  const dirs = [...(process.env.PATH || '').split(':'), '/usr/sbin', '/usr/bin', '/sbin'];
  return dirs.map((d) => path.join(d, cmd)).find((p) => p && fs.existsSync(p));
}

/** Why slapd cannot run here ('' when it can). */
export function slapdMissing() {
  return find('slapd') && find('slapadd') && find('openssl') ? '' : 'slapd, slapadd or openssl not found (apt-get install slapd ldap-utils openssl)';
}

const userDn = (uid) => `uid=${uid},ou=people,${BASE}`;
const groupDn = (cn) => `cn=${cn},ou=groups,${BASE}`;

function dataLdif() {
  let s = `dn: ${BASE}\nobjectClass: dcObject\nobjectClass: organization\ndc: bank\no: Bank\n\n`;
  for (const ou of ['people', 'groups', 'services']) s += `dn: ou=${ou},${BASE}\nobjectClass: organizationalUnit\nou: ${ou}\n\n`;
  s += `dn: ${SERVICE_DN}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\ncn: airlock\nuserPassword: ${SERVICE_PW}\n\n`;
  for (const uid of ['alice', 'bob']) {
    s += `dn: ${userDn(uid)}\nobjectClass: inetOrgPerson\nuid: ${uid}\ncn: ${uid}\nsn: ${uid}\nuserPassword: ${uid}-pw\n\n`;
  }
  s += `dn: ${groupDn('analysts')}\nobjectClass: groupOfNames\ncn: analysts\nmember: ${userDn('alice')}\n\n`;
  s += `dn: ${groupDn('risk')}\nobjectClass: groupOfNames\ncn: risk\nmember: ${userDn('bob')}\n\n`;
  return s;
}

function configLdif(d) {
  return `dn: cn=config
objectClass: olcGlobal
cn: config
olcPidFile: ${d}/slapd.pid
olcTLSCACertificateFile: ${d}/ca.pem
olcTLSCertificateFile: ${d}/server.pem
olcTLSCertificateKeyFile: ${d}/server.key

dn: cn=module{0},cn=config
objectClass: olcModuleList
cn: module{0}
olcModulePath: /usr/lib/ldap
olcModuleLoad: back_mdb

dn: cn=schema,cn=config
objectClass: olcSchemaConfig
cn: schema

include: file:///etc/ldap/schema/core.ldif

include: file:///etc/ldap/schema/cosine.ldif

include: file:///etc/ldap/schema/inetorgperson.ldif

dn: olcDatabase={-1}frontend,cn=config
objectClass: olcDatabaseConfig
objectClass: olcFrontendConfig
olcDatabase: {-1}frontend

dn: olcDatabase={0}config,cn=config
objectClass: olcDatabaseConfig
olcDatabase: {0}config
olcAccess: {0}to * by * none

dn: olcDatabase={1}mdb,cn=config
objectClass: olcDatabaseConfig
objectClass: olcMdbConfig
olcDatabase: {1}mdb
olcSuffix: ${BASE}
olcRootDN: ${ROOT_DN}
olcRootPW: ${ROOT_PW}
olcDbDirectory: ${d}/db
olcAccess: {0}to attrs=userPassword by self write by anonymous auth by * none
olcAccess: {1}to * by dn.exact="${SERVICE_DN}" read by self read by * none
`;
}

function makeCerts(d) {
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  const run = (args) => execFileSync('openssl', args, { cwd: d, stdio: 'pipe' });
  run(['req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '2', '-subj', '/CN=Airlock Browser Test CA',
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign']);
  run(['req', ...ec, '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=localhost']);
  fs.writeFileSync(path.join(d, 'ext.cnf'),
    'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n');
  run(['x509', '-req', '-in', 'server.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-out', 'server.pem', '-days', '2', '-extfile', 'ext.cnf']);
}

/** Starts slapd on a loopback ldaps:// port; `stop()` ends it and removes its directory. */
export async function startSlapd() {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'airlock-slapd-'));
  fs.mkdirSync(path.join(d, 'slapd.d'));
  fs.mkdirSync(path.join(d, 'db'));
  makeCerts(d);
  fs.writeFileSync(path.join(d, 'config.ldif'), configLdif(d));
  fs.writeFileSync(path.join(d, 'data.ldif'), dataLdif());
  const secret = path.join(d, 'bind.secret');
  fs.writeFileSync(secret, `${SERVICE_PW}\n`, { mode: 0o600 });
  fs.chmodSync(secret, 0o600);
  const slapadd = find('slapadd');
  execFileSync(slapadd, ['-n0', '-F', path.join(d, 'slapd.d'), '-l', path.join(d, 'config.ldif')], { stdio: 'pipe' });
  execFileSync(slapadd, ['-n1', '-F', path.join(d, 'slapd.d'), '-l', path.join(d, 'data.ldif')], { stdio: 'pipe' });
  const port = await freePort();
  const url = `ldaps://127.0.0.1:${port}`;
  const log = fs.openSync(path.join(d, 'slapd.log'), 'a');
  const child = spawn(find('slapd'), ['-d', '0', '-F', path.join(d, 'slapd.d'), '-h', `${url}/`], { stdio: ['ignore', log, log] });
  let exited = false;
  child.on('exit', () => {
    exited = true;
  });
  const deadline = Date.now() + 20_000;
  for (;;) {
    const up = await new Promise((res) => {
      const s = net.connect(port, '127.0.0.1', () => {
        s.end();
        res(true);
      });
      s.on('error', () => res(false));
    });
    if (up) break;
    if (exited || Date.now() > deadline) {
      throw new Error(`slapd did not listen: ${fs.readFileSync(path.join(d, 'slapd.log'), 'utf8')}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    url,
    port,
    dir: d,
    /** The `[ldap]` table of airlock.toml for this directory. */
    toml() {
      return `[ldap]
url = "${url}"
ca_file = "${d}/ca.pem"
bind_dn = "${SERVICE_DN}"
bind_password_file = "${secret}"
user_base = "ou=people,${BASE}"
user_filter = "(uid={username})"
user_id_attr = "uid"
group_base = "ou=groups,${BASE}"
group_filter = "(member={user_dn})"
group_name_attr = "cn"
`;
    },
    async stop() {
      if (!exited) {
        child.kill('SIGTERM');
        const t0 = Date.now();
        while (!exited && Date.now() - t0 < 5000) await new Promise((r) => setTimeout(r, 50));
        if (!exited) child.kill('SIGKILL');
      }
      fs.closeSync(log);
      fs.rmSync(d, { recursive: true, force: true });
    },
  };
}

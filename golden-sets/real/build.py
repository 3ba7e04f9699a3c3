#!/usr/bin/env python3
"""Builds a real-document set's corpus folder from Debian packages.

    apt-get download debian-handbook python3.11-doc systemd openssh-client openssh-server
    for d in *.deb; do dpkg -x "$d" pkgroot/; done
    apt-get install mandoc weasyprint      # mandoc: man pages to HTML; weasyprint: HTML to PDF
    python3 build.py SET pkgroot/          # SET: debian-handbook | python-stdlib | systemd-openssh

Writes SET/docs/ (the pages, a third of them as PDF), SET/docs/.acl.jsonl (grants by chapter),
SET/iam_v1.jsonl (= iam_v2.jsonl: users with their groups, and every page's grant),
SET/pages.tsv (doc id, group, source path in the package, how it was made).
Deterministic: the same packages give the same files (PDF bytes depend on weasyprint's version).
"""
import gzip
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Users and their groups: the same pattern in every set (groups named per set, g1..g4).
# g1 is the broad "overview" group most users have; one user lacks it.
USERS = [
    ("u01", ["g1", "g2", "g3", "g4"]),
    ("u02", ["g1", "g2"]),
    ("u03", ["g1", "g3"]),
    ("u04", ["g1", "g4"]),
    ("u05", ["g1", "g2", "g3"]),
    ("u06", ["g2", "g4"]),
    ("u07", ["g1"]),
]

HB = "usr/share/doc/debian-handbook/html/en-US/"
PY = "usr/share/doc/python3.11/html/"

def hb_pages():
    ch = {
        "g1": "preface foreword sect.who-is-this-book-for sect.selected-approach sect.book-structure "
              "sect.contributing sect.acknowledgments the-debian-project sect.foundation-documents "
              "sect.debian-internals sect.follow-debian-news sect.role-of-distributions "
              "sect.release-lifecycle case-study sect.master-plan sect.why-gnu-linux sect.why-debian "
              "sect.why-debian-stable existing-setup sect.how-to-migrate installation "
              "sect.installation-steps sect.after-first-boot conclusion sect.future-of-debian "
              "sect.future-of-this-book derivative-distributions sect.ubuntu sect.linux-mint "
              "sect.knoppix sect.aptosid sect.grml sect.tails sect.kali sect.devuan sect.doudoulinux "
              "sect.raspbian sect.pureos sect.steamos sect.other-derivatives short-remedial-course "
              "sect.filesystem-hierarchy sect.computer-layers sect.kernel-role-and-tasks sect.user-space",
        "g2": "packaging-system sect.package-meta-information sect.source-package-structure "
              "sect.manipulating-packages-with-dpkg sect.coexistence-with-other-packaging-systems apt "
              "sect.apt-get sect.apt-cache sect.apt-file sect.apt-frontends sect.package-authentication "
              "sect.dist-upgrade sect.regular-upgrades sect.automatic-upgrades sect.searching-packages "
              "solving-problems sect.common-procedures debian-packaging sect.building-first-package "
              "sect.setup-apt-package-repository sect.becoming-package-maintainer",
        "g3": "basic-configuration sect.network-config sect.hostname-name-service sect.user-group-databases "
              "sect.creating-accounts sect.shell-environment sect.config-printing sect.config-bootloader "
              "sect.config-misc sect.kernel-compilation sect.kernel-installation unix-services "
              "sect.remote-login sect.rights-management sect.administration-interfaces sect.syslog "
              "sect.inetd sect.task-scheduling-cron-atd sect.asynchronous-task-scheduling-anacron "
              "sect.quotas sect.backup sect.hotplug sect.power-management advanced-administration "
              "sect.virtualization sect.automated-installation sect.monitoring workstation "
              "sect.customizing-graphical-interface sect.graphical-desktops sect.main-desktop-tools "
              "sect.web-browsers sect.development sect.office-suites sect.windows-emulation sect.rtc-clients",
        "g4": "network-infrastructure sect.x509-cert sect.virtual-private-network sect.quality-of-service "
              "sect.dynamic-routing sect.ipv6 sect.domain-name-servers sect.dhcp sect.network-diagnosis-tools "
              "network-services sect.http-web-server sect.ftp-file-server sect.nfs-file-server "
              "sect.windows-file-server-with-samba sect.http-ftp-proxy sect.ldap-directory sect.rtc-services "
              "security sect.firewall-packet-filtering sect.supervision sect.apparmor sect.selinux "
              "sect.other-security-considerations sect.dealing-with-compromised-machine",
    }
    for g, names in ch.items():
        for n in names.split():
            yield f"{n}.html", g, HB + f"{n}.html"


def py_pages():
    ch = {
        # The tutorial, using Python, the FAQs.
        "g1": ["tutorial/" + p for p in "appetite interpreter introduction controlflow datastructures "
               "modules inputoutput errors classes stdlib stdlib2 venv whatnow interactive "
               "floatingpoint appendix".split()]
              + ["using/" + p for p in "cmdline unix windows configure".split()]
              + ["faq/" + p for p in "general library design".split()],
        # Library: text, data types, numbers, functional, file formats, persistence, compression, crypto.
        "g2": ["library/" + p for p in "re string textwrap difflib datetime zoneinfo collections heapq "
               "bisect enum copy pprint array weakref math decimal fractions random statistics itertools "
               "functools operator csv configparser tomllib pickle shelve sqlite3 dbm zlib gzip bz2 "
               "lzma zipfile tarfile hashlib hmac secrets json base64 struct codecs".split()],
        # Library: files, OS services, concurrency, networking, internet protocols.
        "g3": ["library/" + p for p in "pathlib os.path fileinput stat filecmp tempfile glob fnmatch "
               "shutil io time argparse logging logging.config logging.handlers getpass platform errno "
               "threading concurrent.futures subprocess sched queue contextvars asyncio-task "
               "asyncio-subprocess asyncio-queue socket select selectors signal mmap urllib.request "
               "urllib.parse http.server http.client smtplib ipaddress uuid socketserver ftplib shlex "
               "locale".split()],
        # HOWTOs and the development/runtime tools.
        "g4": ["howto/" + p for p in "argparse logging regex sockets sorting unicode urllib2 ipaddress "
               "functional".split()]
              + ["library/" + p for p in "unittest doctest venv zipapp sys warnings contextlib "
                 "dataclasses atexit traceback gc site timeit pdb profile sysconfig".split()],
    }
    for g, names in ch.items():
        for n in names:
            yield f"{n}.html", g, PY + f"{n}.html"


SD = "usr/share/man/"

def man_pages():
    ch = {
        # Units, the service manager and its commands.
        "g1": "man1/systemctl.1 man1/systemd.1 man1/systemd-run.1 man1/systemd-analyze.1 "
              "man1/systemd-escape.1 man1/systemd-notify.1 man1/systemd-socket-activate.1 "
              "man1/systemd-delta.1 man1/systemd-cgtop.1 man1/systemd-mount.1 man5/systemd.unit.5 "
              "man5/systemd.service.5 man5/systemd.socket.5 man5/systemd.timer.5 man5/systemd.exec.5 "
              "man5/systemd.kill.5 man5/systemd.resource-control.5 man5/systemd.path.5 "
              "man5/systemd.mount.5 man5/systemd.automount.5 man5/systemd.swap.5 man5/systemd.target.5 "
              "man5/systemd.slice.5 man5/systemd.scope.5 man5/systemd.device.5 man5/systemd.preset.5 "
              "man5/systemd-system.conf.5 man5/user@.service.5 man7/systemd.special.7 "
              "man7/systemd.syntax.7 man7/systemd.time.7 man7/daemon.7 man7/bootup.7 "
              "man7/systemd.generator.7 man7/systemd.environment-generator.7 "
              "man7/systemd.offline-updates.7 man8/systemd-fstab-generator.8 "
              "man8/systemd-gpt-auto-generator.8 man8/rc-local.service.8 man8/systemd-socket-proxyd.8",
        # Logging, sessions, power.
        "g2": "man1/journalctl.1 man1/systemd-cat.1 man1/loginctl.1 man1/systemd-inhibit.1 "
              "man5/journald.conf.5 man5/logind.conf.5 man5/systemd-sleep.conf.5 man5/pstore.conf.5 "
              "man7/systemd.journal-fields.7 man8/systemd-journald.8 man8/systemd-logind.8 "
              "man8/systemd-sleep.8 man8/systemd-pstore.8 man8/systemd-random-seed.8",
        # Host, network, boot-time configuration files.
        "g3": "man1/hostnamectl.1 man1/timedatectl.1 man1/localectl.1 man1/networkctl.1 "
              "man1/systemd-firstboot.1 man1/systemd-detect-virt.1 man1/systemd-creds.1 "
              "man1/systemd-cryptenroll.1 man5/hostname.5 man5/locale.conf.5 man5/machine-id.5 "
              "man5/machine-info.5 man5/os-release.5 man5/modules-load.d.5 man5/sysctl.d.5 "
              "man5/binfmt.d.5 man5/environment.d.5 man5/networkd.conf.5 man5/systemd.network.5 "
              "man5/systemd.netdev.5 man5/systemd.dnssd.5 man5/tmpfiles.d.5 man5/sysusers.d.5 "
              "man5/repart.d.5 man7/file-hierarchy.7 man7/kernel-command-line.7 "
              "man7/systemd.net-naming-scheme.7 man8/systemd-networkd.8 "
              "man8/systemd-networkd-wait-online.8 man8/systemd-tmpfiles.8 man8/systemd-sysusers.8 "
              "man8/systemd-sysctl.8 man8/systemd-repart.8 man8/systemd-sysext.8 "
              "man8/systemd-time-wait-sync.8 man8/kernel-install.8 man8/systemd-fsck.8 "
              "man8/systemd-remount-fs.8",
        # OpenSSH.
        "g4": "man1/ssh.1 man1/scp.1 man1/sftp.1 man1/ssh-add.1 man1/ssh-agent.1 man1/ssh-keygen.1 "
              "man1/ssh-keyscan.1 man1/ssh-copy-id.1 man5/ssh_config.5 man5/sshd_config.5 "
              "man5/moduli.5 man8/sshd.8 man8/ssh-keysign.8",
    }
    for g, names in ch.items():
        for n in names.split():
            base = n.split("/")[1]
            yield f"{base}.html", g, SD + n + ".gz"


SETS = {
    "debian-handbook": dict(
        pages=hb_pages,
        groups={"g1": "hb-overview", "g2": "hb-packages", "g3": "hb-sysadmin", "g4": "hb-network-security"},
        packages="debian-handbook 11.20220922",
    ),
    "python-stdlib": dict(
        pages=py_pages,
        groups={"g1": "py-tutorial", "g2": "py-lib-data", "g3": "py-lib-system", "g4": "py-howto-tools"},
        packages="python3.11-doc 3.11.2-6+deb12u9",
    ),
    "systemd-openssh": dict(
        pages=man_pages,
        groups={"g1": "sd-units", "g2": "sd-journal-login", "g3": "sd-host-network", "g4": "openssh"},
        packages="systemd 252.39-1~deb12u2, openssh-client and openssh-server 1:9.2p1-2+deb12u10",
    ),
}

PDF_CSS = os.path.join(HERE, "pdf-two-columns.css")


def render_pdf(src_html: str, out_pdf: str, columns: bool) -> bool:
    """Renders; a two-column render that WeasyPrint fails on is redone in one column (returns
    whether the PDF has two columns)."""
    if columns:
        r = subprocess.run(["weasyprint", "-q", "-s", PDF_CSS, src_html, out_pdf],
                           capture_output=True)
        if r.returncode == 0:
            return True
        print(f"two columns failed, one column: {src_html}", file=sys.stderr)
    subprocess.run(["weasyprint", "-q", src_html, out_pdf], check=True)
    return False


def main() -> None:
    name, root = sys.argv[1], sys.argv[2]
    # --resume: keep PDFs already rendered by an interrupted run of the same build.
    resume = "--resume" in sys.argv[3:]
    cfg = SETS[name]
    out = os.path.join(HERE, name)
    docs = os.path.join(out, "docs")
    old_how = {}
    if resume and os.path.isfile(os.path.join(out, "pages.tsv")):
        with open(os.path.join(out, "pages.tsv")) as f:
            old_how = {r.split("\t")[0]: r.rstrip("\n").split("\t")[3] for r in list(f)[1:]}
    if os.path.isdir(docs) and not resume:
        shutil.rmtree(docs)
    os.makedirs(docs, exist_ok=True)
    tmp = os.path.join(out, ".man-html")
    pages = list(cfg["pages"]())
    rows, grants = [], []
    for i, (rel, g, src) in enumerate(pages):
        src_path = os.path.join(root, src)
        if src.endswith(".gz"):
            # A man page: rendered to HTML with mandoc next to nothing else.
            os.makedirs(tmp, exist_ok=True)
            roff = gzip.open(src_path).read()
            html = subprocess.run(["mandoc", "-Thtml", "-Ostyle=mandoc.css"], input=roff,
                                  check=True, capture_output=True).stdout
            src_html = os.path.join(tmp, rel)
            with open(src_html, "wb") as f:
                f.write(html)
            how = "mandoc -Thtml"
        else:
            src_html = src_path
            how = "as shipped"
        # Every third page (by position in the list) becomes a PDF; every other of those in two
        # columns, unless the page is over 120 kB (weasyprint balances columns in minutes there).
        if i % 3 == 2:
            columns = (i // 3) % 2 == 1 and os.path.getsize(src_html) < 120_000
            rel = rel[: -len(".html")] + ".pdf"
            dst = os.path.join(docs, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if resume and os.path.isfile(dst):
                columns = old_how.get(rel, "").endswith("(2 columns)") if rel in old_how else columns
            else:
                columns = render_pdf(src_html, dst, columns)
            how += " + weasyprint" + (" (2 columns)" if columns else "")
        else:
            dst = os.path.join(docs, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(src_html, dst)
        group = cfg["groups"][g]
        rows.append((rel, group, src, how))
        grants.append({"doc": rel, "users": [], "groups": [group]})
    if os.path.isdir(tmp):
        shutil.rmtree(tmp)
    with open(os.path.join(docs, ".acl.jsonl"), "w") as f:
        for rel, group, _, _ in rows:
            f.write(json.dumps({"path": rel, "users": [], "groups": [group]}) + "\n")
    iam = [json.dumps({"user": u, "groups": sorted(cfg["groups"][g] for g in gs)}) for u, gs in USERS]
    iam += [json.dumps(g) for g in grants]
    for v in ("iam_v1.jsonl", "iam_v2.jsonl"):
        with open(os.path.join(out, v), "w") as f:
            f.write("\n".join(iam) + "\n")
    with open(os.path.join(out, "pages.tsv"), "w") as f:
        f.write("doc_id\tgroup\tsource_in_package\tmade_by\n")
        for r in rows:
            f.write("\t".join(r) + "\n")
    print(f"{name}: {len(rows)} pages, {sum(r[0].endswith('.pdf') for r in rows)} PDF")


if __name__ == "__main__":
    main()

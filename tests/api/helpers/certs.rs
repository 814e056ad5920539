//! Certificates of a test's own, made with the `openssl` command: a CA, a server
//! certificate for `localhost` (and only that name), a client certificate, and a second
//! CA that signed none of them.

use std::path::PathBuf;
use std::process::Command;

/// A directory of PEM files, deleted on drop.
pub struct TestCerts {
    dir: PathBuf,
}

/// The CA's own extensions (a CA that may sign certificates), as rustls requires.
const CA_CONFIG: &str = "[req]\ndistinguished_name = dn\nx509_extensions = ca\nprompt = no\n\
[dn]\nCN = quota-ledger test CA\n\
[ca]\nbasicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign, cRLSign\n\
subjectKeyIdentifier = hash\n";

impl TestCerts {
    /// Makes the files in a fresh temp dir.
    pub fn make() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "quota-ledger-certs-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).expect("creating the certificates' dir");
        // Readable by the `postgres` user, which the private Postgres runs as under root.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("opening the certificates' dir");
        let certs = Self { dir };
        std::fs::write(certs.path("ca.cnf"), CA_CONFIG).expect("writing the CA's config");
        for ca in ["ca", "other-ca"] {
            certs.openssl(&[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-config",
                "ca.cnf",
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
            ]);
        }
        certs.leaf(
            "server",
            "subjectAltName = DNS:localhost\nextendedKeyUsage = serverAuth\n",
        );
        certs.leaf("client", "extendedKeyUsage = clientAuth\n");
        certs
    }

    /// A certificate `name.pem` with its key `name.key`, signed by `ca`, with `extensions`.
    fn leaf(&self, name: &str, extensions: &str) {
        let extensions = format!(
            "basicConstraints = CA:FALSE\nkeyUsage = critical, digitalSignature\n{extensions}"
        );
        std::fs::write(self.path(&format!("{name}.ext")), extensions).expect("writing extensions");
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ]);
    }

    fn openssl(&self, args: &[&str]) {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .expect("running openssl (scripts/test.sh installs it)");
        assert!(
            output.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The file `name` in the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The CA that signed the server and client certificates.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// A CA that signed nothing here.
    pub fn other_ca(&self) -> PathBuf {
        self.path("other-ca.pem")
    }

    /// The server's certificate and key.
    pub fn server(&self) -> (PathBuf, PathBuf) {
        (self.path("server.pem"), self.path("server.key"))
    }

    /// The client's certificate and key.
    pub fn client(&self) -> (PathBuf, PathBuf) {
        (self.path("client.pem"), self.path("client.key"))
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

"""The checker's own tests: each rule fires on a tiny tree that breaks it, and stays quiet on one
that only seems to (a comment, a string, a test module); `super::` paths are resolved; the
baseline lets known violations pass, fails on new ones and on lines that no longer occur."""

import io
import os
import shutil
import tempfile
import textwrap
import unittest

import layers

LIB = """\
//! The rooms.
//!
//! ```text
//! daemon, main     wiring: settings -> store -> listeners
//! server           transport          -> every room below
//! facilitator      x402               -> chain store ledger evm svm
//! store            storage            -> ledger evm
//! ledger           records            -> evm
//! chain            nodes              -> evm svm
//! evm              no I/O
//! svm              no I/O
//! ```

pub mod chain;
pub mod daemon;
pub mod evm;
pub mod facilitator;
pub mod ledger;
pub mod server;
pub mod store;
pub mod svm;
"""

# A tree that keeps every rule.
CLEAN = {
    "src/lib.rs": LIB,
    "src/daemon.rs": "use crate::server::serve;\n",
    "src/main.rs": "use routerd::daemon;\n",
    "src/evm.rs": "pub fn hex() {}\n",
    "src/svm.rs": "pub struct Pubkey;\n",
    "src/chain/mod.rs": "pub mod evm;\npub mod svm;\n",
    "src/chain/evm.rs": "use crate::evm::hex;\n",
    "src/chain/svm.rs": "use crate::svm::Pubkey;\n",
    "src/ledger/mod.rs": "pub struct Record;\n",
    "src/store/mod.rs": "pub mod postgres;\npub mod sled;\nuse crate::ledger::Record;\n",
    "src/store/sled/mod.rs": "pub struct Store;\n",
    "src/store/postgres/mod.rs": "pub struct PgStore;\n",
    "src/facilitator/mod.rs":
        "pub mod evm;\npub mod protocol;\npub mod settlement;\npub mod svm;\n",
    "src/facilitator/evm/mod.rs": "use super::settlement::Core;\nuse crate::evm::hex;\n",
    "src/facilitator/svm/mod.rs": "use super::settlement::Core;\nuse crate::svm::Pubkey;\n",
    "src/facilitator/protocol/mod.rs": "pub struct Envelope;\n",
    "src/facilitator/settlement/mod.rs": "pub struct Core;\n",
    "src/server/mod.rs": "use crate::facilitator::protocol::Envelope;\npub fn serve() {}\n",
}


def lines_of(n, line="    let x = 1;"):
    return "\n".join(line.replace("x", f"x{k}") for k in range(n))


class Rules(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="check-layers-")
        self.addCleanup(shutil.rmtree, self.root)

    def tree(self, **changes):
        """CLEAN with `changes` ({path with / as __: text, or None to remove}) written out."""
        files = dict(CLEAN)
        for key, text in changes.items():
            path = key.replace("__", "/").replace("_DOT_", ".")
            if text is None:
                files.pop(path, None)
            else:
                files[path] = textwrap.dedent(text)
        for path, text in files.items():
            full = os.path.join(self.root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        return sorted((v.rule, v.file, v.symbol) for v in layers.check(self.root))

    def test_the_clean_tree_passes(self):
        self.assertEqual(self.tree(), [])

    def test_a_missing_room(self):
        os.makedirs(os.path.join(self.root, "src/facilitator/settlement"), exist_ok=True)
        found = self.tree(src__facilitator__protocol__mod_DOT_rs=None)
        self.assertEqual(found, [("rooms", "src/facilitator/protocol", "-")])

    def test_the_server_names_no_family(self):
        found = self.tree(src__server__mod_DOT_rs="""\
            // SvmPayment and crate::svm are named in this comment only
            /* nested /* SolanaKey */ still a comment */
            const NOTE: &str = "svm solana_chains crate::facilitator::svm";
            const RAW: &str = r#"Svm "quoted" is_solana"#;
            const C: char = '"';
            enum Payment { V1, Svm }
            fn settle_svm<'a>(solana_chains: &'a str) {}
            """)
        self.assertEqual(found, [("server-family", "src/server/mod.rs", "Svm"),
                                 ("server-family", "src/server/mod.rs", "settle_svm"),
                                 ("server-family", "src/server/mod.rs", "solana_chains")])

    def test_the_server_imports_no_family_leaf(self):
        found = self.tree(src__server__mod_DOT_rs="""\
            use crate::{evm::hex, facilitator::{protocol::Envelope, evm as mechanism}};
            fn f() { let _ = crate::svm::Pubkey; }
            """)
        self.assertEqual(found, [("server-family", "src/server/mod.rs", "svm"),
                                 ("server-imports", "src/server/mod.rs", "crate::evm::hex"),
                                 ("server-imports", "src/server/mod.rs", "crate::facilitator::evm"),
                                 ("server-imports", "src/server/mod.rs", "crate::svm::Pubkey")])

    def test_is_solana_exists_nowhere(self):
        found = self.tree(src__chain__svm_DOT_rs="pub fn is_solana(name: &str) -> bool { true }\n")
        self.assertEqual(found, [("is-solana", "src/chain/svm.rs", "is_solana")])

    def test_evm_and_svm_mechanisms_never_import_each_other_super_resolved(self):
        found = self.tree(**{
            "src__facilitator__evm__mod_DOT_rs": "mod exact;\n",
            "src__facilitator__evm__exact_DOT_rs": "use super::super::svm::Fee;\n",
            "src__facilitator__svm__mod_DOT_rs": "use super::evm::{self};\nuse self::inner::X;\n",
        })
        self.assertEqual(found, [
            ("evm-svm", "src/facilitator/evm/exact.rs", "crate::facilitator::svm::Fee"),
            ("evm-svm", "src/facilitator/svm/mod.rs", "crate::facilitator::evm")])

    def test_the_protocol_imports_no_mechanism(self):
        found = self.tree(src__facilitator__protocol__mod_DOT_rs="""\
            mod v2;
            use super::settlement::Settled;
            """, src__facilitator__protocol__v2_DOT_rs="use super::super::svm::Verified;\n")
        self.assertEqual(found, [
            ("protocol-imports", "src/facilitator/protocol/mod.rs",
             "crate::facilitator::settlement::Settled"),
            ("protocol-imports", "src/facilitator/protocol/v2.rs",
             "crate::facilitator::svm::Verified")])

    def test_the_settlement_core_names_no_family(self):
        found = self.tree(src__facilitator__settlement__mod_DOT_rs="""\
            use crate::chain::evm::Client;
            use crate::evm;
            fn f() { let _ = super::svm::Fee; }
            """)
        core = "src/facilitator/settlement/mod.rs"
        self.assertEqual(found, [
            ("settlement-imports", core, "crate::chain::evm::Client"),
            ("settlement-imports", core, "crate::evm"),
            ("settlement-imports", core, "crate::facilitator::svm::Fee")])

    def test_the_ledger_imports_no_family_leaf(self):
        # The map lets the ledger import evm; the rule does not.
        found = self.tree(src__ledger__mod_DOT_rs="use crate::evm::TxFees;\n")
        self.assertEqual(found, [("ledger-imports", "src/ledger/mod.rs", "crate::evm::TxFees")])

    def test_a_room_imports_only_what_its_line_allows(self):
        found = self.tree(src__store__mod_DOT_rs="""\
            pub mod postgres;
            pub mod sled;
            use crate::facilitator::Thing;
            """)
        self.assertEqual(found, [("room-imports", "src/store/mod.rs", "crate::facilitator")])

    def test_a_sub_rooms_arrow_is_not_its_parents(self):
        # `  evm  ... -> settlement` under facilitator: facilitator may still import chain.
        lib = LIB.replace(
            "//! facilitator      x402               -> chain store ledger evm svm\n",
            "//! facilitator      x402               -> chain store ledger evm svm\n"
            "//!   evm            the mechanism      -> settlement\n"
            "//!                                      and more words\n",
        )
        found = self.tree(
            src__lib_DOT_rs=lib,
            src__facilitator__evm__mod_DOT_rs="use super::settlement::Core;\nuse crate::chain::evm;\n",
        )
        self.assertEqual(found, [])

    def test_tests_are_not_code_for_the_import_rules(self):
        found = self.tree(src__ledger__mod_DOT_rs="""\
            pub struct Record;
            #[cfg(test)]
            #[allow(dead_code)]
            mod tests {
                use crate::svm::Pubkey;
                use crate::facilitator::Thing;
            }
            #[cfg(test)]
            mod fixtures;
            #[cfg(all(test, unix))]
            fn helper() { crate::facilitator::thing(); }
            """, src__ledger__fixtures_DOT_rs="use crate::facilitator::Thing;\n")
        self.assertEqual(found, [])

    def test_lib_rs_opens_with_the_map(self):
        found = self.tree(src__lib_DOT_rs="pub mod server;\n" + LIB)
        self.assertIn(("lib-map", "src/lib.rs", "-"), found)
        found = self.tree(src__lib_DOT_rs=LIB + "pub mod extra;\n")
        self.assertEqual(found, [("lib-map", "src/lib.rs", "extra")])

    def test_a_file_over_its_budget_before_its_tests(self):
        body = lines_of(351, "pub const X: u8 = 1;")
        comments = "\n".join("// just a comment" for _ in range(400))
        tests = "#[cfg(test)]\nmod tests {\n" + lines_of(400, "    const X: u8 = 1;") + "\n}\n"
        self.assertEqual(self.tree(src__evm_DOT_rs=body + "\n" + comments + "\n" + body + "\n"),
                         [("file-size", "src/evm.rs", "-")])
        self.assertEqual(self.tree(src__evm_DOT_rs=body + "\n" + comments + "\n" + tests), [])
        all_tests = "#![cfg(test)]\n" + body + "\n" + body + "\n" + body
        self.assertEqual(self.tree(src__evm_DOT_rs=all_tests), [])

    def test_a_function_of_80_lines_tests_included(self):
        def fn(name, lines):
            return f"fn {name}() {{\n" + lines_of(lines - 2) + "\n    // a comment\n\n}\n"
        found = self.tree(src__svm_DOT_rs="""\
            impl<T> Shape for Pubkey<T> where T: Copy {
            """ + fn("long", 80) + fn("short", 79) + """\
            }
            #[cfg(test)]
            mod tests {
            """ + fn("long_test", 80) + "}\n")
        self.assertEqual(found, [("fn-length", "src/svm.rs", "Pubkey::long"),
                                 ("fn-length", "src/svm.rs", "tests::long_test")])

    def test_the_store_backends_repeat_no_run_of_nine_lines(self):
        nine = lines_of(9, "    let shared_x = compute(x);")
        eight = lines_of(8, "    let shared_x = compute(x);")
        found = self.tree(src__store__sled__mod_DOT_rs="fn a() {\n" + nine + "\n}\n",
                          src__store__postgres__mod_DOT_rs="fn b() {\n" + nine + "\n}\n")
        self.assertEqual(found, [("store-duplicates", "src/store/sled/mod.rs",
                                  "src/store/postgres/mod.rs")])
        found = self.tree(src__store__sled__mod_DOT_rs="fn a() {\n" + eight + "\n}\n",
                          src__store__postgres__mod_DOT_rs="fn b() {\n" + eight + "\n    b();\n}\n")
        self.assertEqual(found, [])


class Baseline(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="check-layers-")
        self.addCleanup(shutil.rmtree, self.root)
        for path, text in CLEAN.items():
            full = os.path.join(self.root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        os.makedirs(os.path.join(self.root, "scripts/layers"))

    def write(self, path, text):
        with open(os.path.join(self.root, path), "w") as f:
            f.write(text)

    def run_check(self, **kw):
        out, err = io.StringIO(), io.StringIO()
        return layers.run(self.root, out=out, err=err, **kw), err.getvalue()

    def test_known_violations_pass_new_ones_fail_and_stale_lines_must_go(self):
        self.write("src/ledger/mod.rs", "use crate::svm::Pubkey;\n")
        code, err = self.run_check()
        self.assertEqual(code, 1)
        self.assertIn("src/ledger/mod.rs:1: ledger-imports: crate::svm::Pubkey", err)
        self.assertEqual(self.run_check(write_baseline=True)[0], 0)
        self.assertEqual(self.run_check(), (0, ""))
        self.write("src/ledger/mod.rs", "pub struct Record;\n")
        code, err = self.run_check()
        self.assertEqual(code, 1)
        self.assertIn("`ledger-imports src/ledger/mod.rs crate::svm::Pubkey` no longer occurs: "
                      "delete the line", err)

    def test_a_move_within_a_file_changes_no_baseline_line(self):
        self.write("src/ledger/mod.rs", "use crate::svm::Pubkey;\n")
        self.run_check(write_baseline=True)
        self.write("src/ledger/mod.rs", "\n\n// moved\nuse crate::svm::Pubkey;\n")
        self.assertEqual(self.run_check(), (0, ""))


if __name__ == "__main__":
    unittest.main()

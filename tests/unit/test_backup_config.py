"""The backup's config file (cluster_node.config.BackupConfig): defaults and one-line errors."""

import pytest

from cluster_node.config import ConfigError, parse_backup_config

MEMBERS = "0,127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:0,127.0.0.1:4"


def test_a_minimal_backup_config_takes_the_reference_defaults():
    cfg = parse_backup_config(f'[backup]\ndir = "/tmp/b"\n[cluster]\nmembers = "{MEMBERS}"\n')
    assert cfg.backup.query_interval_ns == 3600 * 10**9
    assert cfg.backup.response_timeout_ns == 5 * 10**9 and cfg.backup.cool_down_ns == 30 * 10**9
    assert str(cfg.archive_dir) == "/tmp/b/archive" and cfg.log_file.name == "backup.log"
    assert cfg.driver_kwargs()["publication_bind_host"] == "127.0.0.1"


@pytest.mark.parametrize(
    "text, error",
    [
        (f'[cluster]\nmembers = "{MEMBERS}"\n', "[backup]: missing table"),
        ('[backup]\ndir = "/tmp/b"\n', "[cluster]: missing table"),
        (f'[backup]\ndir = "/tmp/b"\ncool_down = "0s"\n[cluster]\nmembers = "{MEMBERS}"\n', "backup.cool_down_ns"),
        (f'[backup]\ndir = "/tmp/b"\nquery_intervall = "1s"\n[cluster]\nmembers = "{MEMBERS}"\n', "query_intervall"),
    ],
)
def test_bad_backup_configs_are_refused_in_one_line(text, error):
    with pytest.raises(ConfigError) as e:
        parse_backup_config(text, "backup.toml")
    assert error in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("backup.toml")

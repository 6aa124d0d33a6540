"""Export and audit through S3 URIs, against a moto S3 server on loopback: archives uploaded to
a bucket, read by the plain reader (``export --local``) and by Spark's Python workers (audit),
results written back to the bucket, all through ``pyarrow.fs``."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyarrow")
moto_server = pytest.importorskip("moto.server")

import pyarrow.dataset as ds  # noqa: E402
import pyarrow.fs as pafs  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from tests.support.synthetic_archive import build_log, write_cluster  # noqa: E402

BUCKET = "cluster-archives"


@pytest.fixture(scope="module")
def s3():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    port = server._server.server_port
    fs = pafs.S3FileSystem(
        access_key="test",
        secret_key="test",
        region="us-east-1",
        scheme="http",
        endpoint_override=f"127.0.0.1:{port}",
        allow_bucket_creation=True,
    )
    fs.create_dir(BUCKET)

    def uri(key: str) -> str:
        return f"s3://test:test@{BUCKET}/{key}?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"

    yield fs, uri
    server.stop()


@pytest.fixture(scope="module")
def s3_cluster(s3, tmp_path_factory):
    fs, uri = s3
    log = build_log(seed=13, terms=2, messages_per_term=150)
    cluster = write_cluster(tmp_path_factory.mktemp("s3c"), log)
    for i, node_dir in enumerate(cluster.node_dirs):
        pafs.copy_files(str(node_dir), f"{BUCKET}/cluster/node{i}", destination_filesystem=fs)
    return cluster, [uri(f"cluster/node{i}") for i in range(3)]


def test_local_export_from_and_to_s3(s3, s3_cluster):
    from cluster_node.cli import main

    fs, uri = s3
    cluster, archives = s3_cluster
    outcome = CliRunner().invoke(main, ["pipeline", "export", *archives, "--out", uri("export"), "--local"])
    assert outcome.exit_code == 0, outcome.output
    import pyarrow as pa

    keys = pa.schema([("cluster_id", pa.int32()), ("member_id", pa.int32()), ("date", pa.date32())])
    table = ds.dataset(
        f"{BUCKET}/export/log.parquet",
        filesystem=fs,
        format="parquet",
        partitioning=ds.partitioning(keys, flavor="hive"),
    ).to_table(columns=["position", "node"])
    assert table.num_rows == 3 * len(cluster.log.entries)
    assert sorted(set(table.column("node").to_pylist())) == ["node0", "node1", "node2"]
    marks = fs.get_file_info(pafs.FileSelector(f"{BUCKET}/export/_high_water"))
    assert len(marks) == 3 and all(json.loads(fs.open_input_stream(m.path).read()) for m in marks)
    assert fs.get_file_info(f"{BUCKET}/export/_staging").type == pafs.FileType.NotFound


def test_spark_audit_of_s3_archives_writes_its_report_to_s3(spark, s3, s3_cluster):
    from cluster_node.cli import main

    fs, uri = s3
    cluster, archives = s3_cluster
    # The report's URI in Hadoop's spelling (s3a://), as a Spark cluster would name it.
    outcome = CliRunner().invoke(main, ["pipeline", "audit", *archives, "--out", "s3a" + uri("audit")[2:]])
    assert outcome.exit_code == 0, outcome.output
    report = json.loads(fs.open_input_stream(f"{BUCKET}/audit/audit.json").read())
    assert report["agreed"] is True
    assert report["rows_compared"] == 3 * len(cluster.log.entries)

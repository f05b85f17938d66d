"""`python -m compressor_2 report`: report.html written into the run directory, from the run
archive and the files beside it (read only; any strategy, finished, interrupted or
running). `evolve` refreshes the same page at the end of every step."""

from __future__ import annotations

from compressor_2.archive import ARCHIVE_FILE, RunArchive
from compressor_2.commands.files import Files
from compressor_2.outputs import REPORT_FILE, write_report
from compressor_2.findings import Claims, measured, read_tools_record, refuse_emptied_heldout, refuse_lost, standing


def run_report(files: Files) -> None:
    from compressor_2.data import examples_from_config, holdout_examples

    config = files.config
    pool = examples_from_config(config)
    heldout = holdout_examples(config, pool)
    archive = RunArchive.open_read_only(config.output_dir / ARCHIVE_FILE)
    try:
        # report.html is the run's own file, which this command writes; never over an input.
        files.check_output(config.output_dir / REPORT_FILE, "report's page", kind="HTML page", run_file=True)
        now = standing(archive)
        # Before report.html is written.
        refuse_lost(Claims(archive, pool, heldout), measured(now, read_tools_record(archive)))
        refuse_emptied_heldout(archive, now)
        path = write_report(archive, config.output_dir, pool, heldout, now)
    finally:
        archive.close()
    print(f"wrote {path}")

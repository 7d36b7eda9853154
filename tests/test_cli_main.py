import subprocess
import sys

from dradriver import __version__
from dradriver.cli.main import main


def test_version_flag_prints_the_package_version(capsys):
    try:
        main(["--version"])
    except SystemExit as exit_:
        assert exit_.code == 0
    assert __version__ in capsys.readouterr().out


def test_module_runs_as_a_program():
    out = subprocess.run([sys.executable, "-m", "dradriver", "--help"], capture_output=True, text=True, check=True)
    assert "inventory" in out.stdout

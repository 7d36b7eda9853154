"""The GPU acceptance kit behind ``scripts/gpu-acceptance`` (issue #34): one offline command that proves the
driver on a real NVIDIA GPU in under 8 minutes, and reports every check as skipped where there is none.

- :mod:`.main` parses the command and runs the checks in order; :mod:`.report` holds the catalogue of checks, the
  JSON report and its summary, and the exit statuses;
- :mod:`.prepare` builds the kit (``--prepare``, where there is network) and :mod:`.kit` says what is in it and
  unpacks it on the GPU machine;
- :mod:`.host`, :mod:`.host_checks`, :mod:`.host_workloads` and :mod:`.left_as_found` are the checks that run from
  the outer process (standard library only: it runs before the kit's venv exists);
- :mod:`.node_session` runs in the kit's venv: two ``dradriver run`` instances (:mod:`.node`, :mod:`.session`)
  against the API stand-in, their checks in :mod:`.node_checks` (with NVIDIA's hook) and :mod:`.mps_checks`
  (without, MPS), containers from their CDI specs by :mod:`.container`;
- ``workloads/``: the C programs and the hand-written PTX kernel the containers run.

docs/development.md says how to run it on a GPU machine.
"""

"""Writes AppWorld fixture tasks in the package's own formats, through the package's own code.

Run with the appworld venv's python: ``APPWORLD_PYTHON tests/envs/appworld_fixture.py ROOT``.
The real task data cannot be downloaded here (``appworld download data`` needs S3), so this
builds ``ROOT/data`` the way the package lays it out: the API docs
(``ApiDocCollection.build(...).save()``), per task the databases of an in-memory
``ModelCollection`` (the supervisor, the account passwords, SimpleNote notes) saved by
``Task.save``, the ground truth files (``metadata.json``, ``answer.json``, ``test_data.json``,
``evaluation.py`` with the canary the loader checks) and ``data/datasets/fixture.txt``.

Tasks: ``fixnotes_1`` and ``fixnotes_2`` (one scenario) ask how many notes the supervisor has in
SimpleNote (3 and 5); the answer is checked by the task's evaluation (AppWorld's
``test.answer``).
"""
from __future__ import annotations

import datetime
import json
import os
import sys

SUPERVISOR = dict(first_name="Ada", last_name="Byron", email="ada@example.com",
                  phone_number="5550100", birthday="1990-12-10")
PASSWORD = "pw-12345"
TASKS = {"fixnotes_1": 3, "fixnotes_2": 5}   # AppWorld ids: <scenario>_<n>
INSTRUCTION = "How many notes do I have in SimpleNote?"

EVALUATION = '''
def evaluate(test, public_data, private_data, main_user, models, ground_truth_answer):
    with test("assert the answer is the number of notes."):
        import json
        task = models.end.supervisor.Task.all()[0]
        test.answer(json.loads(task.answer), ground_truth_answer)
'''


def build(root: str) -> None:
    """Write the fixture tasks under ``root`` (see module docstring)."""
    os.environ["APPWORLD_ROOT"] = root
    os.makedirs(root, exist_ok=True)
    os.chdir(root)
    from appworld.apps import get_all_apps
    from appworld.apps.admin.models import MainUserMunch
    from appworld.collections.api_docs import ApiDocCollection
    from appworld.collections.models import ModelCollection
    from appworld.common.constants import DB_VERSION
    from appworld.common.utils import write_file, write_json
    from appworld.ground_truth import inject_canary
    from appworld.task import Task

    ApiDocCollection.build(tuple(get_all_apps())).save()
    apps = get_all_apps(skip_admin=True)
    for task_id, n_notes in TASKS.items():
        models = ModelCollection.load(
            to_db_home_path=f":memory:{task_id}", from_db_home_path=f":memory:{task_id}",
            load_apps=[*apps, "admin"], create_db=True)
        for app in models.app_names:
            models[app].SQLModel.create_db()
        models.admin.MainUser.create_save(**SUPERVISOR)
        sup = models.supervisor.Supervisor.create_save(**SUPERVISOR)
        models.supervisor.Task.create_save(supervisor_id=sup.id, instruction=INSTRUCTION)
        models.supervisor.AccountPassword.create_save(
            supervisor_id=sup.id, account_name="simple_note", password=PASSWORD)
        user = models.simple_note.User.create_save(
            first_name="Ada", last_name="Byron", email=SUPERVISOR["email"], password=PASSWORD,
            verified=True)
        for i in range(n_notes):
            models.simple_note.Note.create_save(user_id=user.id, title=f"note {i}",
                                                content=f"text {i}")
        task = Task(id=task_id, instruction=INSTRUCTION,
                    supervisor=MainUserMunch(**SUPERVISOR, account_passwords={}, addresses={},
                                             payment_cards={}),
                    datetime=datetime.datetime(2023, 5, 18, 12, 0), allowed_apps=apps,
                    db_version=DB_VERSION, model_collection=models)
        task.save(save_ground_truth=False)
        truth = os.path.join(root, "data", "tasks", task_id, "ground_truth")
        os.makedirs(truth, exist_ok=True)
        write_json({"difficulty": 1, "mode": "minimal", "num_apps": 2, "num_apis": 4,
                    "num_api_calls": 4, "num_solution_code_lines": 4},
                   os.path.join(truth, "metadata.json"), silent=True)
        write_json({}, os.path.join(truth, "public_data.json"), silent=True)
        write_json({}, os.path.join(truth, "private_data.json"), silent=True)
        write_file(json.dumps(n_notes), os.path.join(truth, "answer.json"))
        write_json([{"requirement": "assert the answer is the number of notes.",
                     "label": "no_op_fail"}], os.path.join(truth, "test_data.json"),
                   silent=True)
        write_file(inject_canary(EVALUATION), os.path.join(truth, "evaluation.py"))
    datasets = os.path.join(root, "data", "datasets")
    os.makedirs(datasets, exist_ok=True)
    write_file("\n".join(TASKS) + "\n", os.path.join(datasets, "fixture.txt"))


if __name__ == "__main__":
    build(sys.argv[1])

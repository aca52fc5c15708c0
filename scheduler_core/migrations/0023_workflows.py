"""Workflows: a workflow row, each step's place in it (name, parents yet to succeed) and the
edges between steps; a job's spec names the workflow it is a step of, so a claim returns it.
Backwards, the tables and the column go."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler_core", "0022_job_trace_context"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobspec",
            name="workflow_id",
            field=models.BigIntegerField(
                blank=True,
                help_text="The workflow this job is a step of (None: an ordinary job). A claim returns it, so an attempt knows whether its end moves other steps.",
                null=True,
            ),
        ),
        migrations.CreateModel(
            name="Workflow",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=200)),
                (
                    "unique_key",
                    models.CharField(
                        blank=True,
                        help_text="At most one workflow holds a key (a unique index of the keys set).",
                        max_length=300,
                        null=True,
                    ),
                ),
                (
                    "on_failure",
                    models.CharField(
                        choices=[("cancel", "cancel"), ("continue", "continue")],
                        default="cancel",
                        help_text="When a step fails: cancel every step not yet run (cancel), or only its dependents (continue).",
                        max_length=10,
                    ),
                ),
                ("created_at", models.DateTimeField()),
            ],
            options={
                "db_table": "tenure_workflow",
                "indexes": [models.Index(fields=["-created_at"], name="tenure_workflow_created")],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("unique_key__isnull", False)),
                        fields=("unique_key",),
                        name="tenure_workflow_unique_key",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="WorkflowEdge",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("workflow_id", models.BigIntegerField()),
                ("parent_id", models.BigIntegerField()),
                ("child_id", models.BigIntegerField()),
            ],
            options={
                "db_table": "tenure_workflow_edge",
                "indexes": [models.Index(fields=["child_id"], name="tenure_workflow_edge_child")],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("parent_id", "child_id"), name="tenure_workflow_edge_pair"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="WorkflowStep",
            fields=[
                (
                    "job",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="step",
                        serialize=False,
                        to="scheduler_core.job",
                    ),
                ),
                ("name", models.CharField(max_length=200)),
                (
                    "pending",
                    models.IntegerField(default=0, help_text="Parents that have not succeeded."),
                ),
                (
                    "cancelled_by",
                    models.BigIntegerField(
                        blank=True,
                        help_text="The step whose failure or cancel ended this one cancelled (an operator's retry of that step makes this one wait again).",
                        null=True,
                    ),
                ),
                (
                    "workflow",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="steps",
                        to="scheduler_core.workflow",
                    ),
                ),
            ],
            options={
                "db_table": "tenure_workflow_step",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("workflow", "name"), name="tenure_workflow_step_name"
                    )
                ],
            },
        ),
    ]

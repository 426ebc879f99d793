"""Plans: an organization's quota and scheduler weight, set by platform staff.

Creates the default plan ``starter`` (every limit set) and moves each organization's quota onto a
plan with the same limits, so no tenant's limits change with the migration: an organization whose
limits match ``starter`` goes on it; the others go on ``legacy-...`` plans holding their limits
(``legacy-unlimited`` for those with none). Quotas then go.
"""

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models

import accounts.models

# The default plan as shipped: small, but every limit set (PLEXRL_DEFAULT_PLAN names it).
STARTER = {"device_hours_per_month": 100, "max_concurrent_jobs": 2, "max_devices_per_job": 16,
           "weight": 1.0, "max_priority": "normal",
           "description": "The default plan of new organizations."}
LIMITS = ("device_hours_per_month", "max_concurrent_jobs", "max_devices_per_job")


def quotas_to_plans(apps, schema_editor):
    Plan = apps.get_model("accounts", "Plan")
    Organization = apps.get_model("accounts", "Organization")
    Quota = apps.get_model("accounts", "Quota")
    starter = Plan.objects.create(name="starter", **STARTER)
    by_limits = {tuple(float(STARTER[k]) for k in LIMITS): starter}
    for organization in Organization.objects.order_by("id"):
        quota = Quota.objects.filter(organization=organization).first()
        limits = tuple(None if quota is None or getattr(quota, k) is None else float(getattr(quota, k))
                       for k in LIMITS)
        plan = by_limits.get(limits)
        if plan is None:
            name = "legacy-unlimited" if limits == (None, None, None) else f"legacy-{organization.slug}"[:50]
            plan = Plan.objects.create(
                name=name, description="Carried over from the organization's quota before plans.",
                weight=1.0, max_priority="normal", **dict(zip(LIMITS, (getattr(quota, k) if quota else None
                                                                      for k in LIMITS), strict=True)))
            by_limits[limits] = plan
        organization.plan = plan
        organization.save(update_fields=["plan"])


def plans_to_quotas(apps, schema_editor):
    Organization = apps.get_model("accounts", "Organization")
    Quota = apps.get_model("accounts", "Quota")
    for organization in Organization.objects.select_related("plan"):
        Quota.objects.update_or_create(organization=organization,
                                       defaults={k: getattr(organization.plan, k) for k in LIMITS})


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0002_organizations_tokens_quotas_audit'),
    ]

    operations = [
        migrations.AlterField(
            model_name='auditlog',
            name='organization',
            field=models.ForeignKey(blank=True, help_text='Empty: a platform-wide change.', null=True, on_delete=django.db.models.deletion.CASCADE, related_name='audit_log', to='accounts.organization'),
        ),
        migrations.CreateModel(
            name='Plan',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.SlugField(unique=True)),
                ('description', models.CharField(blank=True, max_length=200)),
                ('device_hours_per_month', models.DecimalField(blank=True, decimal_places=2, help_text='Device-hours its jobs may use per calendar month (empty: unlimited).', max_digits=12, null=True, validators=[django.core.validators.MinValueValidator(0)])),
                ('max_concurrent_jobs', models.PositiveIntegerField(blank=True, help_text='Jobs running at once; more wait queued (empty: unlimited).', null=True, validators=[django.core.validators.MinValueValidator(1)])),
                ('max_devices_per_job', models.PositiveIntegerField(blank=True, help_text='Devices one job may reserve (empty: unlimited).', null=True, validators=[django.core.validators.MinValueValidator(1)])),
                ('weight', models.FloatField(default=1.0, help_text="The organization's share of contended devices, relative to other organizations' weights.", validators=[django.core.validators.MinValueValidator(0.01)])),
                ('max_priority', models.CharField(choices=[('low', 'Low'), ('normal', 'Normal'), ('high', 'High')], default='normal', help_text='The highest priority its jobs may ask for.', max_length=8)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'ordering': ('name',),
                'constraints': [models.CheckConstraint(condition=models.Q(('weight__gt', 0)), name='plan_weight_positive')],
            },
        ),
        migrations.AddField(
            model_name='organization',
            name='plan',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='organizations', to='accounts.plan'),
        ),
        migrations.RunPython(quotas_to_plans, plans_to_quotas),
        migrations.AlterField(
            model_name='organization',
            name='plan',
            field=models.ForeignKey(default=accounts.models.default_plan_id, help_text='Set by platform staff only.', on_delete=django.db.models.deletion.PROTECT, related_name='organizations', to='accounts.plan'),
        ),
        migrations.DeleteModel(
            name='Quota',
        ),
    ]

"""Selectors of the jobs app: a job is found only within its own organization."""

import pytest
from django.http import Http404

from jobs import selectors, services
from jobs.models import JobMetric
from tests.platform.builders import SPEC

pytestmark = pytest.mark.django_db



def test_a_job_is_found_in_its_organization_only(tenant, other_tenant):
    job = services.job_create(organization=tenant.organization, user=tenant.member, spec=SPEC, name="mine")
    JobMetric.objects.create(job=job, step=2, seq=5, data={"step": 2})
    detail = selectors.job_get(organization=tenant.organization, pk=job.pk)
    assert (detail.pk, detail.last_step) == (job.pk, 2)
    assert selectors.job_row(organization=tenant.organization, pk=job.pk).pk == job.pk
    for read in (selectors.job_get, selectors.job_row):
        with pytest.raises(Http404):
            read(organization=other_tenant.organization, pk=job.pk)
    assert [j.pk for j in selectors.jobs_of(organization=other_tenant.organization)] == []
